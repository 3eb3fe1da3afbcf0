"""Plot runs' metrics to an image: one panel per metric against the step,
several runs overlaid to compare them."""

from __future__ import annotations

import sys

HELP = "plot runs' metrics to PNG (several runs overlaid)"


def add_arguments(parser) -> None:
  parser.add_argument("run", nargs="+",
                      help="a run directory, e.g. runs/demo, or its "
                      "metrics.jsonl / metrics.csv; several, or a glob "
                      "such as 'runs/lr-*', are overlaid")
  parser.add_argument("-o", "--out", default=None,
                      help="the image to write, its suffix the format: "
                      ".png, .svg, .pdf (default: <run>/metrics.png; "
                      "compare.png beside several runs)")
  parser.add_argument("-m", "--metric", action="append",
                      help="a metric to plot (repeatable; default: every "
                      "scalar metric)")


def run(args) -> int:
  from hostcall._apps.metrics import plot, reading
  runs = args.run if len(args.run) > 1 else args.run[0]
  try:
    if args.metric:
      rows = reading.load(runs).rows()
      present = sorted({name for row in rows for name in row}
                       - {"run", "step", "process", "member", "device"})
      missing = [m for m in args.metric if m not in present]
      if missing:
        args.command_parser.error(
            f"no metric {', '.join(map(repr, missing))} in "
            f"{' '.join(args.run)}; it has "
            f"{', '.join(map(repr, present)) or 'none'}")
    out = plot.plot(runs, args.out, metrics=args.metric or None)
  except FileNotFoundError as exc:
    args.command_parser.error(str(exc))
  except ImportError as exc:
    print(f"hostcall plot: {exc}", file=sys.stderr)
    return 1
  except ValueError as exc:
    args.command_parser.error(str(exc))
  print(out)
  return 0
