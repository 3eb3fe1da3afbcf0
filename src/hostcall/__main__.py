"""The ``hostcall`` command: ``hostcall demo`` and ``hostcall info``."""

from __future__ import annotations

import argparse
import sys


def _info() -> int:
  import jax
  import jaxlib
  import numpy

  import hostcall

  print(f"hostcall {hostcall.__version__}")
  print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"numpy {numpy.__version__}, python {sys.version.split()[0]}")
  print(f"backend {jax.default_backend()}: {jax.devices()}")
  from hostcall import _native
  print("sync taps: jax.interpreters.mlir.emit_python_callback "
        "(ordered by JAX effect tokens)")
  print(f"async taps: {_native.status()}")
  print(f"default delivery: {hostcall._core.modes.current()}")
  return 0


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="hostcall", description="Host-side Python inside compiled JAX.")
  commands = parser.add_subparsers(dest="command", required=True)
  commands.add_parser("demo", help="run taps under jit, vmap, grad and scan")
  commands.add_parser("info", help="versions, devices and the host path")
  args = parser.parse_args(argv)
  if args.command == "demo":
    from hostcall import _demo
    return _demo.main()
  return _info()


if __name__ == "__main__":
  sys.exit(main())
