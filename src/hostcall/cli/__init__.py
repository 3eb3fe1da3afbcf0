"""The ``hostcall`` command: ``demo``, ``bench``, ``plot``, ``info``, ``tour``.

Installed as a console script and runnable as ``python -m hostcall``. Each
command is a module here with ``HELP``, ``add_arguments(parser)`` and
``run(args) -> exit status``; a mistake in the arguments exits with status
2 and a message, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

COMMANDS = ("demo", "bench", "plot", "info", "tour")


def _description(doc: str) -> str:
  """A command module's docstring's first paragraph as ``--help`` shows
  it: plain text (reStructuredText's literal backticks dropped), one
  paragraph."""
  paragraph = doc.strip().split("\n\n")[0]
  return re.sub(r"``([^`]+)``", r"\1", " ".join(paragraph.split()))


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
                              description=_description(module.__doc__))
    module.add_arguments(sub)
    sub.set_defaults(command_run=module.run, command_parser=sub)
  args = parser.parse_args(argv)
  return args.command_run(args)


if __name__ == "__main__":
  sys.exit(main())
