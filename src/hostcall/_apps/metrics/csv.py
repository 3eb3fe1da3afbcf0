"""``CsvWriter``: a CSV table with a header (``Run(writers=["csv"])`` writes
``<run>/metrics.csv``)."""

from __future__ import annotations

import csv
import io
import os
import pathlib

import numpy as np

from hostcall._apps.metrics import config as _config, files, reading
from hostcall._apps.metrics.block import Block, column_texts
from hostcall._apps.metrics.writer import Writer


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

  A writer dropped without ``close()`` closes its file when it is
  garbage-collected.

  Arguments:
    path: the file to write.
    append: go on after the rows the file holds (``Run(...,
      exists="append")``), under its header (widened where new metrics
      come), instead of starting it afresh.

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

  def __init__(self, path: str | os.PathLike, append: bool = False):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._header: list[str] | None = None
    self._fd: int | None = None
    self._closer = None
    self._closed = False
    self._blocks = files.WholeBlocks()
    if append and self.path.is_file() and self.path.stat().st_size:
      fd = files.open_for_append(self.path, truncate=False)
      self._set_fd(fd)
      reading.cut_torn_row(self.path, fd, quoted=True)
      self._header = _last_header(self.path)
      if self._header is None:  # started afresh at the first block
        self._set_fd(None)

  def _set_fd(self, fd: int | None) -> None:
    """Closes the file open (if any); ``fd`` is the one from now on."""
    if self._closer is not None:
      self._closer()
    self._fd = fd
    self._closer = None if fd is None else files.close_when_dropped(self, fd)

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
    texts = {name: column_texts(values, json_style=False)
             for name, values in columns.items()}
    out = io.StringIO(newline="")
    csv.DictWriter(out, self._header, restval="").writerows(
        dict(zip(texts, row)) for row in zip(*texts.values()))
    data = out.getvalue().encode("utf-8")

    def write():
      if os.fstat(self._fd).st_size == 0:  # truncated: a table again
        files.write_all(self._fd, self._header_line() + data)
      else:
        files.write_all(self._fd, data)
    self._blocks.write(self._fd, write)

  def _header_line(self) -> bytes:
    out = io.StringIO(newline="")
    csv.writer(out).writerow(self._header)
    return out.getvalue().encode("utf-8")

  def _open(self, names: list[str], rows: list[dict]) -> None:
    """Starts the file afresh: the header, then ``rows``. Written beside it
    and moved into its place where it holds rows: a table that cannot be
    written whole (a full disk) leaves the rows there were."""
    out = io.StringIO(newline="")
    csv.writer(out).writerow(names)
    csv.DictWriter(out, names, restval="").writerows(rows)
    data = out.getvalue().encode("utf-8")
    if not rows:
      self._set_fd(None)
      self._set_fd(files.open_for_append(self.path))
      self._header = names
      self._blocks.forget()
      self._blocks.write(self._fd, lambda: files.write_all(self._fd, data))
      return
    beside = self.path.with_name(self.path.name + ".widening")
    fd = files.open_for_append(beside)
    try:
      files.write_all(fd, data)
      os.replace(beside, self.path)
    except BaseException:
      os.close(fd)
      beside.unlink(missing_ok=True)
      raise
    self._set_fd(fd)
    self._header = names
    self._blocks.forget()

  def _widen(self, extra: list[str]) -> None:
    self._blocks.repair(self._fd)  # not a failed block's torn row
    with open(self.path, newline="", encoding="utf-8",
              errors="surrogateescape") as f:
      text = f.read()
    rows, _ = reading.csv_rows(text, convert=False)
    self._open(self._header + extra, rows)

  def write_config(self, config: dict) -> None:
    """Writes the run's config to ``config.json`` beside the rows, whole
    (``hostcall.metrics.read_config`` reads it)."""
    _config.write_file(self.path.parent, config)

  def start_afresh(self) -> None:
    """Empties the table (what ``Run(..., exists="overwrite")`` calls once
    all of the run's writers are made): the next block writes a header of
    its own columns, then its rows."""
    if self._fd is not None:
      os.ftruncate(self._fd, 0)
    self._blocks.forget()
    self._header = None

  def flush(self) -> None:
    """Nothing to do: each ``write`` hands its rows to the file."""

  def close(self) -> None:
    """Closes the file; closing twice does nothing."""
    self._closed = True
    self._set_fd(None)


def _last_header(path: pathlib.Path) -> list[str] | None:
  """The last header (a record starting with ``step``) of the table at
  ``path``, or None."""
  with open(path, newline="", encoding="utf-8",
            errors="surrogateescape") as f:
    header = None
    try:
      for fields in csv.reader(f):
        if fields[:1] == ["step"]:
          header = fields
    except csv.Error:  # a cut-off last record: the header is before it
      pass
  return header


def for_run(run_dir: pathlib.Path, append: bool = False) -> CsvWriter:
  """The writer of ``Run(writers=["csv"])``: ``<run_dir>/metrics.csv``,
  started afresh or (``append``) gone on with."""
  return CsvWriter(run_dir / "metrics.csv", append=append)
