"""Reading runs back: ``read`` (a run's rows as a DataFrame) and the tolerant
parsing of ``metrics.jsonl`` / ``metrics.csv`` it rests on (rows cut off
mid-write, or by a truncation from outside, are skipped with an
``IncompleteRowsWarning``)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import warnings
from typing import Any

import numpy as np

from hostcall._apps.metrics import files


def read(path: str | os.PathLike):
  """A run's rows as a pandas DataFrame.

  Arguments:
    path: a run directory (``runs/<name>``) or its ``metrics.jsonl`` /
      ``metrics.csv``. The directory of a run that several processes wrote
      each to their own ``process_<k>/`` (``Run(processes="each")``) is
      read whole: every process's rows, process 0's first.

  Returns:
    A DataFrame with ``step`` (and ``process``, ``member``, ``device``
    where logged) and one column per metric.

  Rows cut off mid-write (a process killed while writing) are skipped, with
  an ``IncompleteRowsWarning`` naming their lines. Rows of one step (and
  process, member, device) that different calls logged (``run.log`` and
  ``run.log_grad``, say) are one row (see ``merge_rows``).

  Example:
    >>> import jax, hostcall, tempfile
    >>> run = hostcall.metrics.Run("read", root=tempfile.mkdtemp())
    >>> _ = jax.jit(lambda: run.log(0, loss=0.5))()
    >>> run.close()
    >>> hostcall.metrics.read(run.dir)["loss"].tolist()
    [0.5]
  """
  return to_dataframe(read_records(path))


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
  """The rows of a run: its directory (``metrics.jsonl``, else
  ``metrics.csv``) or one of those files; the rows of one step that
  different calls logged joined (``merge_rows``)."""
  return merge_rows(_file_records(path))


_INDEX = ("step", "process", "member", "device")


def merge_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """``rows`` with each row joined into the latest earlier one of the same
  step, process, member and device where the two share no metric (what
  ``run.log`` and ``run.log_grad`` logged at one step is one row); a row
  that shares a metric with it (a metric logged twice at one step) stays a
  row of its own, so that no value is lost.

  Arguments:
    rows: dicts, one a row, in the order logged.

  Returns:
    The joined rows, each where its first part was.

  Example:
    >>> from hostcall._apps.metrics.reading import merge_rows
    >>> merge_rows([{"step": 0, "loss": 1.0}, {"step": 1, "loss": 0.5},
    ...             {"step": 0, "grad": 2.0}, {"step": 0, "loss": 0.9}])
    [{'step': 0, 'loss': 1.0, 'grad': 2.0}, {'step': 1, 'loss': 0.5}, {'step': 0, 'loss': 0.9}]
  """
  out: list[dict[str, Any]] = []
  latest: dict[tuple, int] = {}
  for row in rows:
    index = tuple(row.get(name) for name in _INDEX)
    at = latest.get(index)
    if at is not None and all(k in _INDEX or k not in out[at] for k in row):
      out[at].update(row)
    else:
      latest[index] = len(out)
      out.append(dict(row))
  return out


def _file_records(path) -> list[dict[str, Any]]:
  """The rows of a run's directory or file, as written."""
  path = files.as_path(path, "the run to read (a run directory or its "
                       "metrics file)")
  if path.is_dir() and not any((path / name).exists() for name in (
      "metrics.jsonl", "metrics.csv")):
    parts = _process_dirs(path)
    if parts:
      return [{"process": process, **row} if "process" not in row else row
              for process, part in parts for row in _file_records(part)]
  if path.is_dir():
    for name in ("metrics.jsonl", "metrics.csv"):
      if (path / name).exists():
        path = path / name
        break
    else:
      raise FileNotFoundError(
          f"no metrics.jsonl or metrics.csv in {path}; a run directory is "
          "what hostcall.metrics.Run(name, root=...) writes, e.g. runs/demo.")
  if not path.exists():
    raise FileNotFoundError(
        f"no run at {path}: expected a run directory (runs/<name>, written "
        "by hostcall.metrics.Run(name)) or its metrics.jsonl / metrics.csv.")
  with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
    text = f.read()
  rows, dropped = (csv_rows if path.suffix == ".csv" else jsonl_rows)(text)
  if dropped:
    warnings.warn(
        f"{path}: skipped {len(dropped)} incomplete row(s) (line(s) "
        f"{', '.join(map(str, dropped[:10]))}{', ...' if len(dropped) > 10 else ''}"
        "), as a process stopped while writing, or a file truncated from "
        "outside while written, leaves them; the other "
        f"{len(rows)} rows are complete.", IncompleteRowsWarning, stacklevel=3)
  return rows


def _process_dirs(path) -> list:
  """``(k, path/process_<k>)`` for each process's directory of a run that
  several processes wrote, by process."""
  found = []
  for child in path.glob("process_*"):
    number = child.name.partition("_")[2]
    if child.is_dir() and number.isdigit():
      found.append((int(number), child))
  return sorted(found)


class IncompleteRowsWarning(UserWarning):
  """``metrics.read`` skipped rows that were cut off (a process stopped
  mid-write) or are not rows at all.

  The message names the file, the skipped line numbers (the first ten) and
  how many rows are complete; the complete rows are returned. Filter it
  with ``warnings.simplefilter("ignore", IncompleteRowsWarning)`` where a
  run may still be writing.

  Example:
    >>> import pathlib, warnings, hostcall
    >>> path = pathlib.Path("runs/doc-cut/metrics.jsonl")
    >>> path.parent.mkdir(parents=True, exist_ok=True)
    >>> _ = path.write_text('{"step": 0, "loss": 1.0}\\n{"step": 1, "lo')
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter("always")
    ...   frame = hostcall.metrics.read(path)
    >>> len(frame), caught[0].category.__name__
    (1, 'IncompleteRowsWarning')
  """


def to_dataframe(records: list[dict[str, Any]]):
  """``records`` (dicts, one a row) as a pandas DataFrame whose array
  metrics are NumPy arrays, one a cell."""
  try:
    import pandas as pd
  except ImportError as exc:
    raise ImportError("a DataFrame needs pandas: pip install "
                      "'hostcall[pandas]' (or pip install pandas)") from exc
  frame = pd.DataFrame.from_records(records)
  for name in frame.columns:  # array metrics: one NumPy array a cell
    if frame[name].map(lambda v: isinstance(v, list)).any():
      frame[name] = frame[name].map(
          lambda v: np.asarray(v) if isinstance(v, list) else v)
  return frame


# What a truncation from outside can leave where a writer went on at its
# old offset (ours append; an older version or another tool may not): a
# run of NUL bytes before the next row. A crash can leave NULs at a file's
# end too. Neither is a row.
_HOLES = re.compile(r"(?:(?<=\n)|^)\0+")


def _without_holes(text: str) -> str:
  """``text`` without the runs of NUL bytes that start its lines."""
  return _HOLES.sub("", text) if "\0" in text else text


def jsonl_rows(text: str) -> tuple[list, list]:
  rows, dropped = [], []
  for number, line in enumerate(_without_holes(text).split("\n"), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError:
      dropped.append(number)
      continue
    if isinstance(row, dict):
      rows.append(row)
    else:
      dropped.append(number)
  return rows, dropped


def csv_rows(text: str, convert: bool = True) -> tuple[list, list]:
  """The rows of a CSV table (values as numbers where ``convert``, else as
  text), and the line numbers of the records that are not whole rows.

  A header is a record whose first field is ``step`` (the first column the
  writer writes; a row's is a number): where a file was truncated from
  outside, records before the first header (a partial line, rows whose
  header went with the truncation) are not rows, and the writer writes
  the header again when it finds the file empty."""
  text = _without_holes(text)
  reader = csv.reader(io.StringIO(text, newline=""))
  records = []
  while True:
    try:
      fields = next(reader)
    except StopIteration:
      break
    except csv.Error:  # not CSV at all (a cut-off quoted field)
      records.append((reader.line_num, None))
      continue
    records.append((reader.line_num, fields))
  dropped = []
  if records and not text.endswith(("\n", "\r")):
    dropped.append(records.pop()[0])  # cut off before its end of line
  header, rows = None, []
  for number, fields in records:
    if fields == []:
      continue
    if fields is not None and fields[:1] == ["step"]:
      header = fields
      continue
    if header is None or fields is None or len(fields) != len(header):
      dropped.append(number)
      continue
    rows.append({k: (_number(v) if convert else v)
                 for k, v in zip(header, fields) if v != ""})
  return rows, dropped


def _number(text: str):
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text
