"""Where logged metrics go: JSON Lines, CSV, TensorBoard, memory.

A writer receives ``Block``s: columns of equal length, one row per logged
step (and vmap member). Writers run on their run's writer thread, never on
the thread that delivers callbacks, so a slow disk does not slow the device.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import pathlib
import re
import warnings
from typing import Any

import ml_dtypes
import numpy as np


@dataclasses.dataclass
class Block:
  """Rows of metrics: ``step`` and the optional ``member`` / ``device``
  columns, and one column per metric (first axis: the rows).

  What a ``Writer`` receives: the rows of one host delivery of a
  ``Run.log`` call (one step, or ``every`` steps inside ``hostcall.scan``),
  or of several that follow each other with the same columns (the writer
  thread joins what waits for it into one write), with one row per step
  and vmap member, ordered by step, then member. ``len(block)`` is the
  number of rows.

  Attributes:
    step: the step of each row (int64).
    metrics: the metrics by name, each an array whose first axis is the
      rows (a scalar metric is a column; an array metric has the array's
      shape after the first axis). Any string but the index columns'
      names (``step``, ``member``, ``device``) is a name.
    member: the vmap member of each row (row-major over nested vmaps), or
      None outside ``vmap``.
    device: the id of the device that logged each row, or None where JAX
      sees a single device.

  Example:
    >>> import numpy as np, hostcall
    >>> block = hostcall.metrics.Block(
    ...     step=np.array([0, 0]), member=np.array([0, 1]),
    ...     metrics={"w": np.array([[1.0, 2.0], [3.0, 4.0]])})
    >>> len(block)
    2
    >>> block.records()
    [{'step': 0, 'member': 0, 'w': [1.0, 2.0]}, {'step': 0, 'member': 1, 'w': [3.0, 4.0]}]
  """

  step: np.ndarray
  metrics: dict[str, np.ndarray]
  member: np.ndarray | None = None
  device: np.ndarray | None = None

  def __len__(self) -> int:
    return len(self.step)

  @property
  def nbytes(self) -> int:
    """The bytes its arrays hold."""
    columns = [self.step, self.member, self.device, *self.metrics.values()]
    return sum(np.asarray(c).nbytes for c in columns if c is not None)

  def index_columns(self) -> dict[str, np.ndarray]:
    """The columns that say where each row comes from.

    Returns:
      ``{"step": ...}``, with ``"member"`` and ``"device"`` where present, in
      that order: what a writer puts before the metrics.
    """
    columns = {"step": self.step}
    if self.member is not None:
      columns["member"] = self.member
    if self.device is not None:
      columns["device"] = self.device
    return columns

  def records(self) -> list[dict[str, Any]]:
    """The rows as dicts of Python values (arrays become nested lists).

    Returns:
      One dict a row: the index columns (``step``, ``member``, ``device``
      where present), then the metrics. Booleans become 0/1, complex
      numbers their magnitude, small integer and float types of
      ``ml_dtypes`` Python ints and floats.
    """
    columns = {**self.index_columns(), **self.metrics}
    lists = {name: _python(values) for name, values in columns.items()}
    names = list(lists)
    return [dict(zip(names, row)) for row in zip(*lists.values())]


def columns_of(block: Block):
  """What two blocks must share for one block to hold both: their columns'
  names, order, dtypes and shapes after the rows (a block whose columns
  cannot be read gets a value equal to no other)."""
  try:
    return [(name, np.asarray(c).dtype, np.shape(c)[1:])
            for name, c in {**block.index_columns(),
                            **block.metrics}.items()]
  except Exception:  # noqa: BLE001 - whatever cannot be compared is not joined
    return object()


def concatenate(blocks: list[Block]) -> Block:
  """One block with the rows of ``blocks`` (which have the same columns),
  in order."""
  def joined(get):
    return np.concatenate([get(block) for block in blocks])
  first = blocks[0]
  return Block(
      step=joined(lambda b: b.step),
      metrics={name: joined(lambda b, name=name: b.metrics[name])
               for name in first.metrics},
      member=None if first.member is None else joined(lambda b: b.member),
      device=None if first.device is None else joined(lambda b: b.device))


def _plain(values: np.ndarray) -> np.ndarray:
  """``values`` as integers or IEEE floats, which every format can hold."""
  if values.dtype == np.bool_:
    return values.astype(np.int8)
  if np.iscomplexobj(values):
    return np.abs(values)  # formats without complex numbers get magnitudes
  if not (np.issubdtype(values.dtype, np.integer) or
          np.issubdtype(values.dtype, np.floating)):
    try:  # int4, uint2 and the other small integers of ml_dtypes
      ml_dtypes.iinfo(values.dtype)
      return values.astype(np.int64)
    except (TypeError, ValueError):
      return values.astype(np.float32)  # bfloat16, float8 and the like
  return values


def _python(values: np.ndarray) -> list:
  return _plain(values).tolist()


_JSON_NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def _texts(values: np.ndarray, json_style: bool) -> list[str]:
  """One text per row of a scalar column, floats in their shortest form for
  their own precision (a float32 0.1 is written ``0.1``)."""
  plain = _plain(values)
  texts = plain.astype(str).tolist()
  if json_style and np.issubdtype(plain.dtype, np.inexact) and \
      not np.isfinite(plain).all():
    texts = [_JSON_NONFINITE.get(t, t) for t in texts]
  return texts


def _open_for_append(path: pathlib.Path) -> int:
  """A new, empty ``path`` opened for appending (``O_APPEND``): every write
  lands at the file's end as it is then, so that a file truncated from
  outside (logrotate's ``copytruncate``) is written from its new start,
  not from the old offset over a run of NUL bytes."""
  return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND
                 | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0),
                 0o666)


def _write_all(fd: int, data: bytes) -> None:
  """Writes ``data`` in one ``write`` where the OS takes it whole (a block's
  rows together: a truncation from outside falls between blocks, never
  inside a row)."""
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]


class Writer:
  """The interface of a metrics writer; subclass it for a new format.

  A ``hostcall.metrics.Run`` given an instance (``Run(name,
  writers=[MyWriter(...)])``) calls its ``write`` with every block of rows
  logged, on the run's writer thread (shared by every run of the process,
  never the thread that delivers callbacks), in the order the blocks were
  logged; ``flush`` at every ``hostcall.barrier()`` and ``Run.flush()``;
  ``close`` once, when the run closes (``Run.close()``, a new run of the
  same directory, or interpreter exit). Only ``write`` must be defined.

  An exception raised by any of them is logged and raised by the next
  ``hostcall.barrier()`` as ``hostcall.CallbackException``; the run's
  other writers still receive every row.

  Example:
    >>> import jax, hostcall
    >>> class Collect(hostcall.metrics.Writer):
    ...   def __init__(self):
    ...     self.rows = []
    ...   def write(self, block):
    ...     self.rows.extend(block.records())
    >>> collect = Collect()
    >>> run = hostcall.metrics.Run("doc-writer", writers=[collect])
    >>> _ = jax.jit(lambda x: run.log(7, loss=x))(0.5)
    >>> run.close()
    >>> collect.rows
    [{'step': 7, 'loss': 0.5}]
  """

  def write(self, block: Block) -> None:
    """Writes a block of rows.

    Called on the run's writer thread, once per block, blocks in the order
    they were logged. It may take its time: the device and the delivery of
    other callbacks do not wait for it.

    Arguments:
      block: the rows (see ``Block``); its arrays are the writer's to keep.

    Raises:
      NotImplementedError: in this base class; subclasses define it.
    """
    raise NotImplementedError

  def flush(self) -> None:
    """Makes every row written so far reach its destination (a file's
    buffer to the disk, say).

    Called by ``hostcall.barrier()``, ``Run.flush()`` and before ``close``,
    from the thread that asked, once every block logged before has gone
    through ``write``. The base class does nothing.
    """
    pass

  def close(self) -> None:
    """Releases what the writer holds (files, handles); called once, when
    its run closes, after a last ``flush``. No ``write`` follows.

    The base class calls ``flush()``.
    """
    self.flush()


class JsonlWriter(Writer):
  """One JSON object a line: ``{"step": 3, "loss": 0.25, ...}``.

  What ``Run(writers=["jsonl"])`` (the default) writes to
  ``<root>/<name>/metrics.jsonl``. Floats are written in their shortest
  form for their own precision (a float32 0.1 is ``0.1``); an array metric
  is a nested JSON list. Non-finite floats are written as ``NaN`` /
  ``Infinity``, as Python's ``json`` module and pandas read them. The file
  is created afresh (its directory too), and appended to: each block's
  rows reach it in one write (``flush`` has nothing left to do), at its
  end as it is then, so that a file truncated from outside (logrotate's
  ``copytruncate``) goes on from its new start with whole rows.

  Arguments:
    path: the file to write.

  Attributes:
    path: the file written, as a ``pathlib.Path``.

  Example:
    >>> import numpy as np, hostcall
    >>> writer = hostcall.metrics.JsonlWriter("runs/doc-jsonl/metrics.jsonl")
    >>> writer.write(hostcall.metrics.Block(
    ...     step=np.array([0, 1]),
    ...     metrics={"loss": np.array([0.1, np.nan], np.float32)}))
    >>> writer.close()
    >>> print(writer.path.read_text(), end="")
    {"step": 0, "loss": 0.1}
    {"step": 1, "loss": NaN}
  """

  def __init__(self, path: str | os.PathLike):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._fd: int | None = _open_for_append(self.path)

  def write(self, block: Block) -> None:
    """Appends one line per row of ``block`` (in one write).

    Arguments:
      block: the rows to write.
    """
    # Formatted column by column: about a microsecond a row.
    columns = {**block.index_columns(), **block.metrics}
    texts = [
        _texts(values, json_style=True) if values.ndim == 1 else
        [json.dumps(v) for v in _python(values)]
        for values in columns.values()]
    # Names are data: written as JSON strings, their "%" escaped in the
    # row's template (one % formatting a row is four times faster than
    # joining its pieces).
    line = "{" + ", ".join(json.dumps(name).replace("%", "%%") + ": %s"
                           for name in columns) + "}\n"
    if self._fd is None:
      raise ValueError(f"{self.path}: write to a closed JsonlWriter")
    # (JSON escapes what is not ASCII: the text is ASCII.)
    _write_all(self._fd, "".join(line % row for row in zip(*texts)).encode(
        "utf-8", "surrogateescape"))

  def flush(self) -> None:
    """Nothing to do: each ``write`` hands its rows to the file."""

  def close(self) -> None:
    """Closes the file; closing twice does nothing."""
    fd, self._fd = self._fd, None
    if fd is not None:
      os.close(fd)


def _flat_columns(name: str, values: np.ndarray) -> dict[str, np.ndarray]:
  """A metric as CSV columns: ``name`` for a scalar, ``name[i]`` (flat,
  row-major index) for each element of an array."""
  if values.ndim == 1:
    return {name: values}
  flat = values.reshape(len(values), -1)
  return {f"{name}[{i}]": flat[:, i] for i in range(flat.shape[1])}


def _utf8_text(name: str) -> str:
  """``name`` with what UTF-8 cannot encode escaped (``\\udcff``)."""
  return name.encode("utf-8", "backslashreplace").decode("utf-8")


class CsvWriter(Writer):
  """A CSV table with a header; an array metric takes one column an element
  (``w[0]``, ``w[1]``, ...). A metric first logged after rows were written
  widens the table (the file is rewritten once, earlier rows left empty).

  What ``Run(writers=["csv"])`` writes to ``<root>/<name>/metrics.csv``.
  The file is created at the first block (its directory at once). Two
  metrics that would take the same column (an array ``w`` and a scalar
  named ``w[0]``) make ``write`` raise ``ValueError`` rather than write a
  corrupt table.

  The file is appended to, each block's rows in one write: a file
  truncated from outside (logrotate's ``copytruncate``) goes on from its
  new start, and a block that finds it empty writes the header again
  first, so that the file left is a table of its own.

  Arguments:
    path: the file to write.

  Attributes:
    path: the file written, as a ``pathlib.Path``.

  Example:
    >>> import numpy as np, hostcall
    >>> writer = hostcall.metrics.CsvWriter("runs/doc-csv/metrics.csv")
    >>> writer.write(hostcall.metrics.Block(
    ...     step=np.array([0, 1]),
    ...     metrics={"w": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)}))
    >>> writer.close()
    >>> print(writer.path.read_text(), end="")
    step,w[0],w[1]
    0,1.0,2.0
    1,3.0,4.0
  """

  def __init__(self, path: str | os.PathLike):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._header: list[str] | None = None
    self._fd: int | None = None
    self._closed = False

  def write(self, block: Block) -> None:
    """Appends one line per row of ``block`` (in one write), widening the
    table first if the block has new columns, and writing the header first
    where the file is empty (truncated from outside).

    Arguments:
      block: the rows to write.

    Raises:
      ValueError: two metrics would be written to the same column.
    """
    columns = dict(block.index_columns())
    for name, values in block.metrics.items():
      # A name UTF-8 cannot carry (a lone surrogate) is written escaped.
      flat = _flat_columns(_utf8_text(name), values)
      clash = set(flat) & set(columns)
      if clash:
        raise ValueError(
            f"the CSV writer writes metric {name!r} as column(s) "
            f"{sorted(clash)}, which another metric already takes (an array "
            "metric 'w' takes 'w[0]', 'w[1]', ...). Rename one of them, or "
            "use the JSON Lines writer, which keeps arrays whole.")
      columns.update(flat)
    names = list(columns)
    if self._closed:
      raise ValueError(f"{self.path}: write to a closed CsvWriter")
    if self._header is None:
      self._open(names, [])
    elif not set(names) <= set(self._header):
      self._widen([n for n in names if n not in self._header])
    texts = {name: _texts(values, json_style=False)
             for name, values in columns.items()}
    out = io.StringIO(newline="")
    csv.DictWriter(out, self._header, restval="").writerows(
        dict(zip(texts, row)) for row in zip(*texts.values()))
    data = out.getvalue()
    if os.fstat(self._fd).st_size == 0:
      data = self._header_line() + data  # truncated: a table again
    _write_all(self._fd, data.encode("utf-8"))

  def _header_line(self) -> str:
    out = io.StringIO(newline="")
    csv.writer(out).writerow(self._header)
    return out.getvalue()

  def _open(self, names: list[str], rows: list[dict]) -> None:
    """Starts the file afresh: the header, then ``rows``."""
    self._header = names
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None
    self._fd = _open_for_append(self.path)
    out = io.StringIO(newline="")
    csv.DictWriter(out, names, restval="").writerows(rows)
    _write_all(self._fd, (self._header_line() + out.getvalue()).encode(
        "utf-8"))

  def _widen(self, extra: list[str]) -> None:
    with open(self.path, newline="", encoding="utf-8",
              errors="surrogateescape") as f:
      text = f.read()
    rows, _ = _csv_rows(text, convert=False)
    self._open(self._header + extra, rows)

  def flush(self) -> None:
    """Nothing to do: each ``write`` hands its rows to the file."""

  def close(self) -> None:
    """Closes the file; closing twice does nothing."""
    self._closed = True
    fd, self._fd = self._fd, None
    if fd is not None:
      os.close(fd)


class TensorBoardWriter(Writer):
  """TensorBoard event files through ``tensorboardX`` (the ``tensorboard``
  extra): scalars as scalars, arrays as histograms; a vmap member's values
  under ``<name>/member_<k>``.

  What ``Run(writers=["tensorboard"])`` writes to
  ``<root>/<name>/tensorboard/`` (``tensorboard --logdir runs`` shows every
  run). Where rows carry a device, its values go under
  ``<name>/device_<id>`` (then ``/member_<k>``). Any metric name is taken as
  a tag.

  Arguments:
    logdir: the directory of the event files.

  Attributes:
    logdir: that directory, as a ``pathlib.Path``.

  Raises:
    ImportError: ``tensorboardX`` is not installed (``pip install
      'hostcall[tensorboard]'``).

  Example:
    >>> import numpy as np, hostcall
    >>> writer = hostcall.metrics.TensorBoardWriter("runs/doc-tb/tensorboard")
    >>> writer.write(hostcall.metrics.Block(
    ...     step=np.array([0, 1]), metrics={"loss": np.array([1.0, 0.5])}))
    >>> writer.close()
    >>> any(p.name.startswith("events.") for p in writer.logdir.iterdir())
    True
  """

  def __init__(self, logdir: str | os.PathLike):
    try:
      from tensorboardX import SummaryWriter
    except ImportError as exc:
      raise ImportError(
          "the TensorBoard writer needs tensorboardX: pip install "
          "'hostcall[tensorboard]' (or pip install tensorboardX)") from exc
    self.logdir = pathlib.Path(logdir)
    self._writer = SummaryWriter(logdir=str(self.logdir))

  def write(self, block: Block) -> None:
    """Adds a scalar (scalar metrics) or a histogram (array metrics) per
    row and metric, at the row's step.

    Arguments:
      block: the rows to write.
    """
    steps = block.step.tolist()
    members = (block.member.tolist() if block.member is not None
               else [None] * len(steps))
    devices = (block.device.tolist() if block.device is not None
               else [None] * len(steps))
    for name, values in block.metrics.items():
      scalar = values.ndim == 1
      values = np.asarray(_python(values), dtype=np.float64)
      for row, (step, member, device) in enumerate(zip(steps, members,
                                                       devices)):
        tag = name
        if device is not None:
          tag += f"/device_{device}"
        if member is not None:
          tag += f"/member_{member}"
        if scalar:
          self._writer.add_scalar(tag, float(values[row]), step)
        else:
          self._writer.add_histogram(tag, values[row], step)

  def flush(self) -> None:
    """Writes the pending events to the event file."""
    self._writer.flush()

  def close(self) -> None:
    """Flushes and closes the event file."""
    self._writer.close()


class MemoryWriter(Writer):
  """Keeps every row in memory; ``dataframe()`` returns them as a pandas
  DataFrame, ``records()`` as dicts.

  What ``Run(writers=["memory"])`` uses, and what ``Run.records()`` and
  ``Run.dataframe()`` read when the run has one (after flushing the run;
  read the writer itself only after ``hostcall.barrier()`` or
  ``Run.flush()``).

  Example:
    >>> import numpy as np, hostcall
    >>> writer = hostcall.metrics.MemoryWriter()
    >>> writer.write(hostcall.metrics.Block(
    ...     step=np.array([0, 1]), metrics={"loss": np.array([1.0, 0.5])}))
    >>> writer.records()
    [{'step': 0, 'loss': 1.0}, {'step': 1, 'loss': 0.5}]
  """

  def __init__(self):
    self._blocks: list[Block] = []

  def write(self, block: Block) -> None:
    """Keeps ``block``.

    Arguments:
      block: the rows to keep.
    """
    self._blocks.append(block)

  def records(self) -> list[dict[str, Any]]:
    """Every row kept so far, as dicts of Python values.

    Returns:
      One dict a row, in the order written (see ``Block.records``).
    """
    return [r for block in self._blocks for r in block.records()]

  def dataframe(self):
    """Every row kept so far, as a pandas DataFrame.

    Returns:
      A ``pandas.DataFrame`` with ``step`` (and ``member``, ``device``
      where logged) and a column per metric; an array metric's cells are
      NumPy arrays. A metric missing from some rows is NaN there.

    Raises:
      ImportError: pandas is not installed (``pip install
        'hostcall[pandas]'``).
    """
    return to_dataframe(self.records())


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


_NAMED = {"jsonl": lambda run_dir: JsonlWriter(run_dir / "metrics.jsonl"),
          "csv": lambda run_dir: CsvWriter(run_dir / "metrics.csv"),
          "tensorboard": lambda run_dir: TensorBoardWriter(
              run_dir / "tensorboard"),
          "memory": lambda run_dir: MemoryWriter()}


def make(spec, run_dir: pathlib.Path) -> Writer:
  """A writer from its name (``"jsonl"``, ``"csv"``, ``"tensorboard"``,
  ``"memory"``) or a ``Writer`` instance."""
  if isinstance(spec, Writer):
    return spec
  if isinstance(spec, str) and spec in _NAMED:
    return _NAMED[spec](run_dir)
  raise ValueError(f"a metrics writer is one of {sorted(_NAMED)} or a "
                   f"hostcall.metrics.Writer instance; got {spec!r}.")


def as_path(value, what: str) -> pathlib.Path:
  """``value`` (a ``str`` or ``os.PathLike``) as a path, or a ``TypeError``
  naming ``what`` it is, what came and what is taken."""
  if not isinstance(value, (str, os.PathLike)):
    raise TypeError(f"{what} is a path (a str or os.PathLike, e.g. "
                    f"'runs/fit'), got {value!r} of type "
                    f"{type(value).__name__}.")
  return pathlib.Path(value)


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
  """The rows of a run: its directory (``metrics.jsonl``, else
  ``metrics.csv``) or one of those files."""
  path = as_path(path, "the run to read (a run directory or its metrics "
                 "file)")
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
  rows, dropped = (_csv_rows if path.suffix == ".csv" else _jsonl_rows)(text)
  if dropped:
    warnings.warn(
        f"{path}: skipped {len(dropped)} incomplete row(s) (line(s) "
        f"{', '.join(map(str, dropped[:10]))}{', ...' if len(dropped) > 10 else ''}"
        "), as a process stopped while writing, or a file truncated from "
        "outside while written, leaves them; the other "
        f"{len(rows)} rows are complete.", IncompleteRowsWarning, stacklevel=3)
  return rows


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


def _jsonl_rows(text: str) -> tuple[list, list]:
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


def _csv_rows(text: str, convert: bool = True) -> tuple[list, list]:
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
