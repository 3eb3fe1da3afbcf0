"""The ``hostcall`` command: ``demo``, ``bench``, ``plot``, ``info``, ``tour``.

Installed as a console script and runnable as ``python -m hostcall``. Each
command is a module here with ``HELP``, ``add_arguments(parser)`` and
``run(args) -> exit status``; a mistake in the arguments exits with status
2 and a message, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("demo", "bench", "plot", "info", "tour")


def main(argv: list[str] | None = None) -> int:
  import hostcall
  parser = argparse.ArgumentParser(
      prog="hostcall",
      description="Host-side Python inside compiled JAX programs.")
  parser.add_argument("--version", action="version",
                      version=f"hostcall {hostcall.__version__}")
  commands = parser.add_subparsers(dest="command", required=True,
                                   metavar="{" + ",".join(COMMANDS) + "}")
  for name in COMMANDS:
    module = importlib.import_module(f"hostcall.cli.{name}")
    sub = commands.add_parser(name, help=module.HELP,
                              description=module.__doc__.strip().splitlines()[0])
    module.add_arguments(sub)
    sub.set_defaults(command_run=module.run, command_parser=sub)
  args = parser.parse_args(argv)
  return args.command_run(args)


if __name__ == "__main__":
  sys.exit(main())
