"""`make bench`: hostcall's speed targets against plain JAX, written to
benchmarks/results (the harness: ``harness.py`` here; also ``hostcall bench``
from this checkout)."""

import pathlib
import sys

from hostcall.cli import main

if __name__ == "__main__":
  out = pathlib.Path(__file__).parent / "results"
  sys.exit(main(["bench", "--out", str(out), *sys.argv[1:]]))
