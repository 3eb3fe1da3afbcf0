"""``hostcall bench``: the benchmarks of a source checkout
(``benchmarks/``, which ``make bench`` runs), from the command line.

The harness is not part of the installed package: it is found beside the
source tree this hostcall was imported from (an editable install), or in
``./benchmarks``.
"""

from __future__ import annotations

import importlib
import pathlib
import sys

import hostcall
from hostcall.cli.arguments import positive_int

HELP = "hostcall's speed against plain JAX, measured here (source checkout)"


def add_arguments(parser) -> None:
  parser.add_argument("--steps", type=positive_int, default=2000,
                      help="steps of the benchmark scan (default: 2000)")
  parser.add_argument("--repeats", type=positive_int, default=7,
                      help="timed runs per row; rows report the median "
                      "(default: 7)")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes: check that the benchmark runs")
  parser.add_argument("--rows", action="append", default=None,
                      metavar="GROUP",
                      help="measure only this group's rows (repeatable), "
                      "e.g. 'mixed calls'; the plain scan is always "
                      "measured (default: every group)")
  parser.add_argument("--out", default=None,
                      help="directory for latest.json and latest.png "
                      "(default: a new temporary directory, printed)")


def benchmarks_dir() -> pathlib.Path | None:
  """The ``benchmarks/`` folder holding ``harness.py``, or None."""
  checkout = pathlib.Path(hostcall.__file__).resolve().parents[2]
  for folder in (checkout / "benchmarks", pathlib.Path.cwd() / "benchmarks"):
    if (folder / "harness.py").is_file():
      return folder
  return None


def run(args) -> int:
  folder = benchmarks_dir()
  if folder is None:
    print("hostcall bench: the benchmarks live in hostcall's source "
          "repository (benchmarks/harness.py), not in the installed package, "
          "and none was found beside this installation or in ./benchmarks. "
          "Run it from a clone: `make bench`.", file=sys.stderr)
    return 2
  sys.path.insert(0, str(folder))
  try:
    harness = importlib.import_module("harness")
  finally:
    sys.path.remove(str(folder))
  return harness.run(args)
