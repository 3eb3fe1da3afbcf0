"""Runs' metrics as an image: one panel per scalar metric against the step,
several runs overlaid to compare them."""

from __future__ import annotations

import collections
import math
import os
import pathlib
import re

from hostcall._apps.metrics import files, reading


def plot(runs, out: str | os.PathLike | None = None, *,
         metrics: list[str] | None = None, log_scale: bool | None = None
         ) -> pathlib.Path:
  """Plots runs' scalar metrics against the step and saves the figure.

  Arguments:
    runs: a run directory (``runs/<name>``), a metrics file, a
      ``hostcall.metrics.Run``, a glob of run directories
      (``"runs/lr-*"``), or a list of these: several runs are overlaid,
      one colour a run, named in each panel's legend.
    out: the image's path; its suffix picks the format (``.png``,
      ``.svg``, ``.pdf``). Default: ``<run directory>/metrics.png`` for
      one run, ``compare.png`` in the directory that holds several.
    metrics: the metrics to plot; default every scalar metric.
    log_scale: a logarithmic y axis; default: for a positive metric that
      spans more than two decades.

  Returns:
    The path of the image written.

  One panel per metric; one line per run and, within a run, per vmap
  member (``member`` column), device or process; beyond eight of those in
  a run, their mean drawn over them. An SVG keeps its text as text.

  Raises:
    ImportError: matplotlib is not installed (``pip install 'hostcall[plot]'``).
    FileNotFoundError: no run at a path, or none matches a glob.
    ValueError: the runs have no scalar metric to plot.

  Example:
    >>> import jax, hostcall, tempfile
    >>> root = tempfile.mkdtemp()
    >>> for lr in (0.1, 0.2):
    ...   run = hostcall.metrics.Run(f"lr-{lr}", root=root)
    ...   _ = jax.jit(lambda: [run.log(i, loss=1.0 / (lr * i + 1)) for i in range(3)])()
    ...   run.close()
    >>> hostcall.metrics.plot(f"{root}/lr-0.1").name
    'metrics.png'
    >>> hostcall.metrics.plot(f"{root}/lr-*").name
    'compare.png'
  """
  plt = _pyplot()
  _check_options(metrics, log_scale, out)
  found, several = reading.run_paths(runs, "plot's run")
  table = reading.load([p for _, p in found] if several else found[0][1])
  records = table.rows()
  index = _INDEX if several else _INDEX - {"run"}
  names = metrics or _scalar_metrics(records, index)
  if metrics:
    logged = {key for record in records for key in record}
    missing = [name for name in metrics if name not in logged]
    if missing:
      raise ValueError(
          f"{_shown(runs)}: no metric {missing[0]!r} was logged; plot's "
          f"metrics= takes names among {sorted(logged - index)}.")
  if not names:
    raise ValueError(f"{_shown(runs)}: no scalar metrics to plot "
                     f"(found {len(records)} rows)")
  out = pathlib.Path(out) if out is not None else _default_out(found,
                                                               several)
  columns = min(len(names), 2)
  rows = math.ceil(len(names) / columns)
  with plt.rc_context({"svg.fonttype": "none"}):  # text stays text
    figure, axes = plt.subplots(rows, columns,
                                figsize=(6 * columns, 3.2 * rows),
                                squeeze=False)
    for ax, name in zip(axes.flat, names):
      _panel(ax, name, records, table.runs if several else None, log_scale)
    for ax in list(axes.flat)[len(names):]:
      ax.set_visible(False)
    figure.suptitle(_title(table.runs))
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
  plt.close(figure)
  return out


#: The columns that say where a row comes from, not metrics.
_INDEX = frozenset({"run", "step", "process", "member", "device"})

#: Line styles that tell a run's members apart where a colour is the run's.
_STYLES = ("-", "--", ":", "-.")


def _pyplot():
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError as exc:
    raise ImportError("plots need matplotlib: pip install 'hostcall[plot]' "
                      "(or pip install matplotlib)") from exc
  return plt


def _check_options(metrics, log_scale, out) -> None:
  if metrics is not None and (isinstance(metrics, str) or not all(
      isinstance(m, str) for m in metrics)):
    raise TypeError(f"plot's metrics= is a list of metric names (str), e.g. "
                    f"metrics=['loss'], got {metrics!r}.")
  if log_scale is not None and not isinstance(log_scale, bool):
    raise TypeError(f"plot's log_scale= is True, False or None (chosen per "
                    f"metric), got {log_scale!r}.")
  if out is not None:
    files.as_path(out, "plot's out= (the image to write)")


def _panel(ax, name, records, runs, log_scale) -> None:
  """Draws metric ``name``'s lines on ``ax``: one a (run,) process, device
  and member; ``runs``: the runs' names where several are compared (a
  colour each), else None."""
  groups = collections.defaultdict(lambda: collections.defaultdict(list))
  for record in records:
    if name in record:
      key = (record.get("process"), record.get("device"),
             record.get("member"))
      run = record["run"] if runs is not None else None
      groups[run][key].append((record["step"], record[name]))
  labelled = 0
  for run, lines in groups.items():
    colour = None if runs is None else f"C{runs.index(run) % 10}"
    many = len(lines) > 8
    for number, (key, points) in enumerate(
        sorted(lines.items(), key=lambda kv: str(kv[0]))):
      points.sort()
      label = None if many else _label(run, key, len(lines))
      labelled += label is not None
      ax.plot(*zip(*points), linewidth=1, alpha=0.35 if many else 0.9,
              color=colour, label=label, gid=_gid(name, run, key),
              linestyle=_STYLES[number % 4] if colour and not many else "-")
    if many:  # too many lines to tell apart: their mean tells the story
      by_step = collections.defaultdict(list)
      for points in lines.values():
        for step, value in points:
          by_step[step].append(value)
      steps = sorted(by_step)
      prefix = "" if run is None else f"{run}: "
      ax.plot(steps, [sum(by_step[s]) / len(by_step[s]) for s in steps],
              color=colour or "black", linewidth=1.5,
              label=f"{prefix}mean of {len(lines)}",
              gid=_gid(name, run, "mean"))
      labelled += 1
  if labelled:
    ax.legend(loc="best", fontsize=8)
  values = [v for lines in groups.values() for points in lines.values()
            for _, v in points
            if isinstance(v, (int, float)) and math.isfinite(v)]
  if log_scale or (log_scale is None and values and min(values) > 0 and
                   max(values) / min(values) > 100):
    ax.set_yscale("log")
  ax.set_title(name)
  ax.set_xlabel("step")
  ax.grid(alpha=0.3)


def _label(run, key, lines: int) -> str | None:
  parts = [f"{kind} {value}" for kind, value in
           zip(("process", "device", "member"), key) if value is not None]
  where = ", ".join(parts) if lines > 1 else ""
  if run is None:
    return where or None
  return f"{run}: {where}" if where else str(run)


def _gid(name, run, key) -> str:
  """The line's id in an SVG: ``metric/run/where``, what XML ids take."""
  where = key if isinstance(key, str) else ",".join(
      f"{kind}={value}" for kind, value in
      zip(("process", "device", "member"), key) if value is not None)
  text = "/".join(str(part) for part in (name, run, where) if part)
  return re.sub(r"[^\w.,=/-]", "_", text)


def _default_out(found, several) -> pathlib.Path:
  """``<run>/metrics.png`` for one run; ``compare.png`` in the directory
  that holds several."""
  paths = [pathlib.Path(getattr(p, "dir", p)) for _, p in found]
  paths = [p.parent if p.is_file() else p for p in paths]
  if not several:
    return paths[0] / "metrics.png"
  try:
    holder = pathlib.Path(os.path.commonpath(
        [p.resolve().parent for p in paths]))
  except ValueError:  # on different drives
    holder = pathlib.Path.cwd()
  return holder / "compare.png"


def _title(runs: list[str]) -> str:
  if len(runs) <= 4:
    return ", ".join(runs)
  return f"{len(runs)} runs: {', '.join(runs[:3])}, ..."


def _shown(runs) -> str:
  return ", ".join(map(str, runs)) if isinstance(runs, (list, tuple)) else (
      str(getattr(runs, "dir", runs)))


def _scalar_metrics(records, index) -> list[str]:
  names = {}
  for record in records:
    for name, value in record.items():
      if name in index:
        continue
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        names.setdefault(name, True)
  return list(names)
