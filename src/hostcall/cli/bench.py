"""hostcall's speed targets, measured against plain JAX in the same run.

The rows are in ``bench_rows`` (one function each). Every row times a jitted ``lax.scan`` whose step is one 64x64 float32 matmul
(plus ``tanh``), with and without taps, median of REPEATS runs after a
warm-up, and reports microseconds per step and the ratio to the same scan
without callbacks (or to the quantity the target names). Results go to the
terminal, to ``<out>/latest.json`` and, when matplotlib is installed, to
``<out>/latest.png``.

Usage: hostcall bench [--steps N] [--repeats R] [--smoke] [--out DIR]
(``make bench`` runs it with ``--out benchmarks/results``).
"""

from __future__ import annotations

import json
import pathlib
import platform
import tempfile

import jax

import hostcall
from hostcall.cli.arguments import positive_int
from hostcall.cli.bench_rows import measure


def _print(rows, steps, repeats) -> None:
  print(f"hostcall benchmarks: scan of {steps} steps (64x64 matmul), median "
        f"of {repeats}; jax {jax.__version__}, {platform.machine()}, "
        f"queue: {hostcall.queue_stats()['native'] and 'native' or 'python'}")
  print(f"{'row':62s} {'us/step':>9s} {'ratio':>7s} {'target':>7s}  result")
  for r in rows:
    us = "-" if r["us_per_step"] is None else f"{r['us_per_step']:.2f}"
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
    target = "" if r["target"] is None else f"{r['target']:.2f}x"
    verdict = {None: "", True: "pass", False: "MISS"}[r["pass"]]
    print(f"{r['row']:62s} {us:>9s} {ratio:>7s} {target:>7s}  {verdict} "
          f"{r['note']}")


def _chart(rows, path) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  shown = [r for r in rows if r["ratio"] is not None]
  fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 1))
  names = [r["row"] for r in shown]
  ratios = [r["ratio"] for r in shown]
  colors = ["tab:gray" if r["pass"] is None else
            ("tab:green" if r["pass"] else "tab:red") for r in shown]
  ax.barh(names, ratios, color=colors)
  for i, r in enumerate(shown):
    if r["target"] is not None:
      ax.plot([r["target"]] * 2, [i - 0.4, i + 0.4], "k--")
  ax.set_xscale("log")
  ax.invert_yaxis()
  ax.set_xlabel("ratio (dashed: target; green pass, red miss, grey reference)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  return True


HELP = "hostcall's speed against plain JAX, measured here"


def add_arguments(parser) -> None:
  parser.add_argument("--steps", type=positive_int, default=2000,
                      help="steps of the benchmark scan (default: 2000)")
  parser.add_argument("--repeats", type=positive_int, default=7,
                      help="timed runs per row; rows report the median "
                      "(default: 7)")
  parser.add_argument("--smoke", action="store_true",
                      help="tiny sizes: check that the benchmark runs")
  parser.add_argument("--out", default=None,
                      help="directory for latest.json and latest.png "
                      "(default: a new temporary directory, printed)")


def run(args) -> int:
  steps, repeats = (40, 2) if args.smoke else (args.steps, args.repeats)
  rows = measure(steps, repeats)
  _print(rows, steps, repeats)
  results = pathlib.Path(args.out or
                         tempfile.mkdtemp(prefix="hostcall-bench-"))
  results.mkdir(parents=True, exist_ok=True)
  (results / "latest.json").write_text(json.dumps(
      {"steps": steps, "repeats": repeats, "jax": jax.__version__,
       "machine": platform.machine(), "rows": rows}, indent=2))
  print(f"results: {results / 'latest.json'}")
  if _chart(rows, results / "latest.png"):
    print(f"chart: {results / 'latest.png'}")
  return 0
