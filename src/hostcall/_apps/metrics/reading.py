"""Reading runs back: ``load`` (runs' rows and configs with NumPy alone),
``read`` (the same as a DataFrame) and the tolerant
parsing of ``metrics.jsonl`` / ``metrics.csv`` it rests on (rows cut off
mid-write, or by a truncation from outside, are skipped with an
``IncompleteRowsWarning``)."""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import pathlib
import re
import sys
import warnings
from typing import Any

from hostcall._apps.metrics import config as _config, files
from hostcall._apps.metrics.table import Table, to_dataframe


def read(runs):
  """Runs' rows as a pandas DataFrame.

  Arguments:
    runs: a run directory (``runs/<name>``) or its ``metrics.jsonl`` /
      ``metrics.csv``; a glob of them (``"runs/lr-*"``); a
      ``hostcall.metrics.Run``; or a list of these. The directory of a run
      that several processes wrote each to
      their own ``process_<k>/`` (``Run(processes="each")``) is read
      whole: every process's rows, process 0's first.

  Returns:
    A DataFrame with ``step`` (and ``process``, ``member``, ``device``
    where logged) and one column per metric; for a list or a glob, a
    ``run`` column first, each row's run (its directory's name). Each
    run's config is in ``attrs["configs"]``, by run.

  Rows cut off mid-write (a process killed while writing) are skipped, with
  an ``IncompleteRowsWarning`` naming their lines. Rows of one step (and
  process, member, device) that different calls logged (``run.log`` and
  ``run.log_grad``, say) are one row (see ``merge_rows``).
  ``hostcall.metrics.load`` reads the same without pandas.

  Raises:
    ImportError: pandas is not installed (``pip install
      'hostcall[pandas]'``; or read with ``hostcall.metrics.load``).
    FileNotFoundError: no run at a path, or none matches a glob.

  Example:
    >>> import jax, hostcall, tempfile
    >>> run = hostcall.metrics.Run("read", root=tempfile.mkdtemp())
    >>> _ = jax.jit(lambda: run.log(0, loss=0.5))()
    >>> run.close()
    >>> hostcall.metrics.read(run.dir)["loss"].tolist()
    [0.5]
  """
  try:
    import pandas  # noqa: F401 - said before any file is read
  except ImportError as exc:
    raise ImportError(
        "hostcall.metrics.read returns a pandas DataFrame, and pandas is not "
        "installed: pip install 'hostcall[pandas]' (or pip install pandas), "
        "or read the runs with hostcall.metrics.load, which needs NumPy "
        "alone.") from exc
  return load(runs).to_pandas()


def load(runs):
  """Runs' rows and configs, read with NumPy alone.

  Arguments:
    runs: a run directory (``runs/<name>``) or its ``metrics.jsonl`` /
      ``metrics.csv``; a glob of them (``"runs/lr-*"``); a
      ``hostcall.metrics.Run`` (its rows so far: it is flushed first); or
      a list of these. A run that several processes wrote
      (``process_<k>/``) is read whole, process 0's rows first.

  Returns:
    A ``hostcall.metrics.Table``: one NumPy array a column
    (``table["loss"]``), ``table.rows()`` as dicts, the run's config as
    ``table.config``. For a list or a glob, a ``run`` column first (each
    row's run, its directory's name) and ``table.configs`` by run.

  Rows are read as ``read`` reads them (cut-off rows skipped, with an
  ``IncompleteRowsWarning``; a step's rows that different calls logged
  joined); ``read`` is the same as a pandas DataFrame.

  Raises:
    FileNotFoundError: no run at a path, or none matches a glob.

  Example:
    >>> import jax, hostcall, tempfile
    >>> root = tempfile.mkdtemp()
    >>> for lr in (0.1, 0.2):
    ...   run = hostcall.metrics.Run(f"lr-{lr}", root=root)
    ...   _ = jax.jit(lambda: [run.log(i, loss=lr * i) for i in range(2)])()
    ...   run.close()
    >>> table = hostcall.metrics.load(f"{root}/lr-*")
    >>> table["run"].tolist(), table["loss"].tolist()
    (['lr-0.1', 'lr-0.1', 'lr-0.2', 'lr-0.2'], [0.0, 0.1, 0.0, 0.2])
  """
  found, several = run_paths(runs, "the run to read")
  rows, configs = [], {}
  for name, path in found:
    if hasattr(path, "records"):  # a Run: its rows so far, its config
      records = path.records()
      configs[name] = (path.config.as_dict() if hasattr(path, "config")
                       else {})
    else:
      records, configs[name] = read_records(path), _config.read_config(path)
    if several:
      if any("run" in row for row in records):
        raise ValueError(
            f"{name} logs a metric named 'run', the column that says each "
            "row's run where several runs are read together: read it "
            "alone, or rename the metric.")
      records = [{"run": name, **row} for row in records]
    rows += records
  return Table(rows, configs)


def run_paths(runs, what: str) -> tuple[list, bool]:
  """``runs`` (a path, a glob, a ``Run``, or a list of them) as ``(name,
  path or Run)`` pairs, one a run, and whether they are several (a list or
  a glob: their rows take a ``run`` column). A glob takes the runs it
  matches (directories with rows, metrics files) and leaves the rest."""
  several = isinstance(runs, (list, tuple))
  items = list(runs) if several else [runs]
  if several and not items:
    raise ValueError(f"{what}: an empty list; give run directories, e.g. "
                     "['runs/a', 'runs/b'], or a glob, e.g. 'runs/lr-*'.")
  found = []
  for item in items:
    if hasattr(item, "records") and hasattr(item, "dir"):  # a Run
      found.append((pathlib.Path(item.dir).name, item))
      continue
    path = files.as_path(item, f"{what} (a run directory or its metrics "
                         "file, a glob of them, a hostcall.metrics.Run, or "
                         "a list of these)")
    if path.exists() or not glob.has_magic(str(item)):
      found.append((_run_name(path), path))
      continue
    several = True
    matches = [pathlib.Path(m) for m in sorted(glob.glob(str(item)))]
    matches = [m for m in matches if _holds_rows(m)]
    if not matches:
      raise FileNotFoundError(
          f"no run matches {str(item)!r}: a glob takes run directories "
          "(runs/<name>, written by hostcall.metrics.Run(name)) and "
          "metrics files, e.g. 'runs/lr-*'.")
    found += [(_run_name(m), m) for m in matches]
  names = [name for name, _ in found]
  if len(set(names)) < len(names):  # the same name under two roots
    found = [(str(getattr(p, "dir", p)), p) for _, p in found]
  return found, several


def _run_name(path: pathlib.Path) -> str:
  return (path.parent if path.name in ("metrics.jsonl", "metrics.csv")
          else path).name


def _holds_rows(path: pathlib.Path) -> bool:
  """Whether ``path`` is a run's directory or metrics file."""
  if path.is_file():
    return path.name in ("metrics.jsonl", "metrics.csv")
  return path.is_dir() and (
      any((path / n).is_file() for n in ("metrics.jsonl", "metrics.csv"))
      or bool(_process_dirs(path)))


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
        f"{len(rows)} rows are complete.", IncompleteRowsWarning,
        stacklevel=_user_stacklevel())
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


def cut_torn_row(path: pathlib.Path, fd: int, quoted: bool = False) -> None:
  """Cuts off the start of a row that a stopped process left at the end of
  the file ``fd`` (at ``path``), which a writer goes on with (its first row
  would be joined to it), with an ``IncompleteRowsWarning``."""
  cut = files.cut_torn_line(fd, quoted)
  if cut:
    warnings.warn(
        f"{path}: cut off its last row, {cut} byte(s) without an end of "
        "line (a process stopped while writing it), before going on with "
        "the file.", IncompleteRowsWarning, stacklevel=_user_stacklevel())


# hostcall's own files: a warning points at the first line outside them.
_PACKAGE_DIR = str(pathlib.Path(__file__).parents[2]) + os.sep


def _user_stacklevel() -> int:
  """The ``stacklevel`` of a warning raised here that points at the user's
  line, the first frame outside hostcall."""
  frame, level = sys._getframe(1), 1
  while frame is not None and frame.f_code.co_filename.startswith(
      _PACKAGE_DIR):
    frame, level = frame.f_back, level + 1
  return level if frame is not None else 2


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
