"""`make bench`: hostcall's speed targets against plain JAX, written to
benchmarks/results (see ``hostcall.cli.bench``; also ``hostcall bench``)."""

import pathlib
import sys

from hostcall.cli import main

if __name__ == "__main__":
  out = pathlib.Path(__file__).parent / "results"
  sys.exit(main(["bench", "--out", str(out), *sys.argv[1:]]))
