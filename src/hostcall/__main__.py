"""The ``hostcall`` command: ``demo``, ``bench``, ``plot``, ``info``, ``tour``.

Installed as a console script and runnable as ``python -m hostcall``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys


def _version(distribution: str) -> str:
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def _info(args) -> int:
  import jax
  import jaxlib
  import numpy

  import hostcall
  from hostcall import _native

  print(f"hostcall {hostcall.__version__}")
  print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"numpy {numpy.__version__}, python {sys.version.split()[0]}")
  print(f"backend {jax.default_backend()}: {jax.devices()}")
  print(f"processes: {jax.process_count()} (this one: {jax.process_index()})")
  print("sync taps: jax.interpreters.mlir.emit_python_callback "
        "(ordered by JAX effect tokens)")
  print(f"async taps: {_native.status()}")
  print(f"default delivery: {hostcall._core.modes.current()}")
  print("extras: " + ", ".join(
      f"{name} {_version(name)}" for name in
      ("tqdm", "pandas", "matplotlib", "tensorboardX", "scipy")))
  return 0


def _plot(args) -> int:
  from hostcall._apps import plot
  try:
    out = plot.plot(args.run, args.out, metrics=args.metric or None)
  except (FileNotFoundError, ValueError, ImportError) as exc:
    print(f"hostcall plot: {exc}", file=sys.stderr)
    return 1
  print(out)
  return 0


def _demo(args) -> int:
  from hostcall import _demo
  return _demo.main(args.rest)


def _bench(args) -> int:
  from hostcall import _bench
  return _bench.main(args.rest)


def _tour(args) -> int:
  from hostcall import _tour
  return _tour.main()


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="hostcall", description="Host-side Python inside compiled JAX.")
  commands = parser.add_subparsers(dest="command", required=True)
  demo = commands.add_parser(
      "demo", add_help=False,
      help="fit a model that calls SciPy inside one jitted scan, with a "
           "progress bar, metrics in runs/demo and their plot "
           "(hostcall demo --help for its options)")
  demo.set_defaults(handler=_demo)
  bench = commands.add_parser(
      "bench", add_help=False,
      help="hostcall's speed against plain JAX (hostcall bench --help)")
  bench.set_defaults(handler=_bench)
  plot = commands.add_parser("plot", help="plot a run's metrics to PNG")
  plot.add_argument("run", help="a run directory, e.g. runs/demo, or its "
                    "metrics.jsonl / metrics.csv")
  plot.add_argument("-o", "--out", default=None,
                    help="the PNG (default: <run>/metrics.png)")
  plot.add_argument("-m", "--metric", action="append",
                    help="a metric to plot (repeatable; default: all)")
  plot.set_defaults(handler=_plot)
  info = commands.add_parser(
      "info", help="versions, devices and which host path is active")
  info.set_defaults(handler=_info)
  tour = commands.add_parser(
      "tour", help="legacy host_callback taps under jit, scan, vmap, grad")
  tour.set_defaults(handler=_tour)
  args, rest = parser.parse_known_args(argv)
  if rest and args.command not in ("demo", "bench"):
    parser.error(f"unrecognized arguments: {' '.join(rest)}")
  args.rest = rest
  return args.handler(args)


if __name__ == "__main__":
  sys.exit(main())
