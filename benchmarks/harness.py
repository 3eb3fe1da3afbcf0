"""hostcall's speed targets, measured against plain JAX in the same run
(``make bench``, or ``hostcall bench`` from a source checkout).

The rows are in ``rows_taps``, ``rows_apps``, ``rows_jit``, ``rows_compile``
and ``rows_mixed_calls`` (one function each, or one for rows measured
together), each named by what it measures;
``ROWS`` below says which speed target each function's rows measure, and
``common.TARGETS`` numbers the targets as docs/performance.md calls them.
Most rows time a jitted ``lax.scan`` whose step is one 64x64 float32 matmul
(plus ``tanh``), with and without host calls, and report microseconds per
step and the ratio to the same scan without callbacks (or to the quantity
the target names).
Results go to the terminal, to ``<out>/latest.json`` and, when matplotlib
is installed, to ``<out>/latest.png``.
"""

from __future__ import annotations

import json
import pathlib
import platform
import sys
import tempfile
import warnings

import jax

import hostcall

import rows_apps
import rows_compile
import rows_jit
import rows_mixed_calls
import rows_taps
from common import Bench, numbered

#: Every function of rows, in the order printed, with the speed target its
#: rows measure (numbered in ``common.TARGETS``; None: a reference).
ROWS = (
    (None, rows_taps.plain_scan),
    (None, rows_taps.jax_references),
    ("default tap", rows_taps.default_tap),
    ("default tap", rows_taps.ordered_vs_unordered),
    ("loop-buffered tap", rows_taps.loop_buffered),
    ("async tap", rows_taps.async_device_side),
    ("async tap", rows_taps.async_dispatch),
    ("async tap", rows_taps.async_slow_host),
    ("one tap a call", rows_taps.one_tap_per_call),
    ("1 MiB async tap", rows_taps.big_async_tap),
    ("busy main thread", rows_taps.busy_main_thread),
    ("progress bar and metrics", rows_apps.progress_bar),
    ("progress bar and metrics", rows_apps.progress_bar_postfix),
    ("progress bar and metrics", rows_apps.short_loop_bar),
    ("progress bar and metrics", rows_apps.metrics_rows),
    ("peers", rows_apps.peers),
    ("steered loops", rows_apps.steered_loops),
    ("backward pass", rows_apps.backward_pass),
    ("tracking writers", rows_apps.tracking_writers),
    ("hostcall.jit", rows_jit.jit_rows),
    ("compile time", rows_compile.compile_rows),
    ("mixed calls", rows_mixed_calls.mixed_calls_rows),
)


def groups() -> list[str]:
  """The groups ``--rows`` may name (each row's target), in ROWS' order."""
  return list(dict.fromkeys(target for target, _ in ROWS if target))


def measure(steps: int, repeats: int, only=None) -> list[dict]:
  """Every row (or those of the groups ``only`` names), measured against
  the same plain scan, each named with its target's number."""
  bench = Bench(steps, repeats)
  # Some rows call a jax.jit program from a Python loop on purpose:
  # hostcall's hint that hostcall.jit would be faster is not printed.
  warnings.filterwarnings("ignore", category=hostcall.SlowDispatchWarning)
  rows = []
  for target, rows_of in ROWS:
    if only and target not in only and rows_of is not rows_taps.plain_scan:
      continue
    for r in rows_of(bench):
      rows.append({**r, "row": numbered(target, r["row"])})
  return rows


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


def run(args) -> int:
  steps, repeats = (40, 2) if args.smoke else (args.steps, args.repeats)
  only = getattr(args, "rows", None)
  unknown = [name for name in only or () if name not in groups()]
  if unknown:
    print(f"hostcall bench: argument --rows: expected one of "
          f"{', '.join(map(repr, groups()))}; got {unknown[0]!r}. Quote a "
          f"name with spaces.", file=sys.stderr)
    return 2
  rows = measure(steps, repeats, only)
  _print(rows, steps, repeats)
  results = pathlib.Path(args.out or
                         tempfile.mkdtemp(prefix="hostcall-bench-"))
  results.mkdir(parents=True, exist_ok=True)
  (results / "latest.json").write_text(json.dumps(
      {"steps": steps, "repeats": repeats, "jax": jax.__version__,
       "machine": platform.machine(),
       # (A run of some groups says so: it is not the whole table.)
       "groups": only or "all", "rows": rows}, indent=2))
  print(f"results: {results / 'latest.json'}")
  if _chart(rows, results / "latest.png"):
    print(f"chart: {results / 'latest.png'}")
  return 0
