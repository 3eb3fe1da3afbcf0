"""`make bench`: hostcall's speed targets against plain JAX (see
``hostcall._bench``; also ``hostcall bench``)."""

import pathlib
import sys

from hostcall import _bench

if __name__ == "__main__":
  out = pathlib.Path(__file__).parent / "results"
  sys.exit(_bench.main(["--out", str(out), *sys.argv[1:]]))
