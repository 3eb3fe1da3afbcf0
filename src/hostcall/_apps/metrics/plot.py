"""A run's metrics as a PNG: one panel per scalar metric against the step."""

from __future__ import annotations

import collections
import math
import os
import pathlib

from hostcall._apps.metrics import files, reading


def plot(run, out: str | os.PathLike | None = None, *,
         metrics: list[str] | None = None, log_scale: bool | None = None
         ) -> pathlib.Path:
  """Plots a run's scalar metrics against the step and saves a PNG.

  Arguments:
    run: a run directory (``runs/<name>``), a metrics file, or a
      ``hostcall.metrics.Run``.
    out: the PNG's path; default ``<run directory>/metrics.png``.
    metrics: the metrics to plot; default every scalar metric.
    log_scale: a logarithmic y axis; default: for a positive metric that
      spans more than two decades.

  Returns:
    The path of the PNG written.

  One panel per metric; one line per vmap member (``member`` column),
  device or process, and beyond eight of them their mean in black.

  Raises:
    ImportError: matplotlib is not installed (``pip install 'hostcall[plot]'``).
    FileNotFoundError: no run at ``run``.
    ValueError: the run has no scalar metric to plot.

  Example:
    >>> import jax, hostcall, tempfile
    >>> run = hostcall.metrics.Run("plot", root=tempfile.mkdtemp())
    >>> _ = jax.jit(lambda: [run.log(i, loss=1.0 / (i + 1)) for i in range(3)])()
    >>> run.close()
    >>> hostcall.metrics.plot(run.dir).name
    'metrics.png'
  """
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError as exc:
    raise ImportError("plots need matplotlib: pip install 'hostcall[plot]' "
                      "(or pip install matplotlib)") from exc
  if metrics is not None and (isinstance(metrics, str) or not all(
      isinstance(m, str) for m in metrics)):
    raise TypeError(f"plot's metrics= is a list of metric names (str), e.g. "
                    f"metrics=['loss'], got {metrics!r}.")
  if log_scale is not None and not isinstance(log_scale, bool):
    raise TypeError(f"plot's log_scale= is True, False or None (chosen per "
                    f"metric), got {log_scale!r}.")
  if out is not None:
    files.as_path(out, "plot's out= (the PNG to write)")
  if hasattr(run, "records"):
    records, directory = run.records(), run.dir
  else:
    path = files.as_path(run, "plot's run (a hostcall.metrics.Run, a run "
                         "directory or its metrics file)")
    records = reading.read_records(path)
    directory = path if path.is_dir() else path.parent
  names = metrics or _scalar_metrics(records)
  if metrics:
    logged = {key for record in records for key in record}
    missing = [name for name in metrics if name not in logged]
    if missing:
      raise ValueError(
          f"{run}: no metric {missing[0]!r} was logged; plot's metrics= "
          f"takes names among {sorted(logged - _INDEX)}.")
  if not names:
    raise ValueError(f"{run}: no scalar metrics to plot "
                     f"(found {len(records)} rows)")
  out = pathlib.Path(out) if out is not None else directory / "metrics.png"
  columns = min(len(names), 2)
  rows = math.ceil(len(names) / columns)
  figure, axes = plt.subplots(rows, columns, figsize=(6 * columns, 3.2 * rows),
                              squeeze=False)
  for ax, name in zip(axes.flat, names):
    lines = collections.defaultdict(list)
    for record in records:
      if name in record:
        key = (record.get("process"), record.get("device"),
               record.get("member"))
        lines[key].append((record["step"], record[name]))
    many = len(lines) > 8
    for key, points in sorted(lines.items(), key=lambda kv: str(kv[0])):
      points.sort()
      ax.plot(*zip(*points), linewidth=1, alpha=0.35 if many else 0.9,
              label=None if many or len(lines) == 1 else _label(key))
    if many:  # too many lines to tell apart: their mean tells the story
      by_step = collections.defaultdict(list)
      for points in lines.values():
        for step, value in points:
          by_step[step].append(value)
      steps = sorted(by_step)
      ax.plot(steps, [sum(by_step[s]) / len(by_step[s]) for s in steps],
              color="black", linewidth=1.5, label=f"mean of {len(lines)}")
    if len(lines) > 1:
      ax.legend(loc="best", fontsize=8)
    values = [v for points in lines.values() for _, v in points
              if isinstance(v, (int, float)) and math.isfinite(v)]
    if log_scale or (log_scale is None and values and min(values) > 0 and
                     max(values) / min(values) > 100):
      ax.set_yscale("log")
    ax.set_title(name)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(names):]:
    ax.set_visible(False)
  figure.suptitle(directory.name)
  figure.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  figure.savefig(out, dpi=100)
  plt.close(figure)
  return out


#: The columns that say where a row comes from, not metrics.
_INDEX = frozenset({"step", "process", "member", "device"})


def _label(key) -> str:
  parts = [f"{kind} {value}" for kind, value in
           zip(("process", "device", "member"), key) if value is not None]
  return ", ".join(parts)


def _scalar_metrics(records) -> list[str]:
  names = {}
  for record in records:
    for name, value in record.items():
      if name in _INDEX:
        continue
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        names.setdefault(name, True)
  return list(names)
