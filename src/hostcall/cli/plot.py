"""Plot a run's metrics to a PNG: one panel per metric against the step."""

from __future__ import annotations

import sys

HELP = "plot a run's metrics to PNG"


def add_arguments(parser) -> None:
  parser.add_argument("run", help="a run directory, e.g. runs/demo, or its "
                      "metrics.jsonl / metrics.csv")
  parser.add_argument("-o", "--out", default=None,
                      help="the PNG to write (default: <run>/metrics.png)")
  parser.add_argument("-m", "--metric", action="append",
                      help="a metric to plot (repeatable; default: every "
                      "scalar metric)")


def run(args) -> int:
  from hostcall._apps.metrics import plot, reading
  try:
    if args.metric:
      records = reading.read_records(args.run)
      present = sorted({name for row in records for name in row}
                       - {"step", "member", "device"})
      missing = [m for m in args.metric if m not in present]
      if missing:
        args.command_parser.error(
            f"no metric {', '.join(map(repr, missing))} in {args.run}; it "
            f"has {', '.join(map(repr, present)) or 'none'}")
    out = plot.plot(args.run, args.out, metrics=args.metric or None)
  except FileNotFoundError as exc:
    args.command_parser.error(str(exc))
  except ImportError as exc:
    print(f"hostcall plot: {exc}", file=sys.stderr)
    return 1
  except ValueError as exc:
    args.command_parser.error(str(exc))
  print(out)
  return 0
