"""``JsonlWriter``: one JSON object a line (``Run(writers=["jsonl"])``, the
default, writes ``<run>/metrics.jsonl``)."""

from __future__ import annotations

import json
import os
import pathlib

from hostcall._apps.metrics import config as _config, files
from hostcall._apps.metrics import reading
from hostcall._runtime import texts
from hostcall._apps.metrics.block import (Block, column_texts,
                                          constant_text, plain,
                                          python_values)
from hostcall._apps.metrics.writer import Writer


class JsonlWriter(Writer):
  """One JSON object a line: ``{"step": 3, "loss": 0.25, ...}``.

  What ``Run(writers=["jsonl"])`` (the default) writes to
  ``<root>/<name>/metrics.jsonl``. Floats are written in their shortest
  form for their own precision (a float32 0.1 is ``0.1``); an array metric
  is a nested JSON list. Non-finite floats are written as ``NaN`` /
  ``Infinity``, as Python's ``json`` module and pandas read them. The file
  is created afresh (its directory too), and appended to: a block's rows
  reach it in one write (each 65,536 rows of a larger one; ``flush`` has
  nothing left to do), at its end as it is then, so that a file truncated
  from outside (logrotate's ``copytruncate``) goes on from its new start
  with whole rows.

  A writer dropped without ``close()`` closes its file when it is
  garbage-collected.

  Arguments:
    path: the file to write.
    append: go on after the rows the file holds (``Run(...,
      exists="append")``) instead of starting it afresh.

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

  def __init__(self, path: str | os.PathLike, append: bool = False):
    self.path = pathlib.Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._fd: int | None = files.open_for_append(self.path,
                                                 truncate=not append)
    self._closer = files.close_when_dropped(self, self._fd)
    self._blocks = files.WholeBlocks()
    if append:
      reading.cut_torn_row(self.path, self._fd)

  def write(self, block: Block) -> None:
    """Appends one line per row of ``block`` (in one write, where it is not
    larger than 65,536 rows).

    Arguments:
      block: the rows to write.
    """
    columns = {**block.index_columns(), **block.metrics}
    if self._fd is None:
      raise ValueError(f"{self.path}: write to a closed JsonlWriter")
    self._blocks.write(self._fd, lambda: self._write(columns))

  def _write(self, columns: dict) -> None:
    # Names are data: written as JSON strings.
    names = [json.dumps(name) for name in columns]
    # Every row at once by the native formatter, where it can; a text
    # column of one value (a call's text, known when it was traced) is
    # part of the row's template.
    pieces, numbers = ["{"], []
    for i, (name, values) in enumerate(zip(names, columns.values())):
      pieces[-1] += (", " if i else "") + name + ": "
      text = constant_text(values)
      if text is None:
        numbers.append(plain(values))
        pieces.append("")
      else:
        pieces[-1] += json.dumps(text)
    pieces[-1] += "}\n"
    if texts.write_rows(self._fd, pieces, numbers, json=True):
      return
    # Formatted column by column: about a microsecond a row.
    column_text_lists = [
        column_texts(values, json_style=True) if values.ndim == 1 else
        [json.dumps(v) for v in python_values(values)]
        for values in columns.values()]
    # Their "%" escaped in the row's template (one % formatting a row is
    # four times faster than joining its pieces).
    line = "{" + ", ".join(n.replace("%", "%%") + ": %s" for n in names) + "}\n"
    # (JSON escapes what is not ASCII: the text is ASCII.)
    files.write_all(self._fd, "".join(line % row for row in zip(*column_text_lists)).encode(
        "utf-8", "surrogateescape"))

  def write_config(self, config: dict) -> None:
    """Writes the run's config to ``config.json`` beside the rows, whole
    (``hostcall.metrics.read_config`` reads it)."""
    _config.write_file(self.path.parent, config)

  def start_afresh(self) -> None:
    """Empties the file (what ``Run(..., exists="overwrite")`` calls once
    all of the run's writers are made): the next rows are its first."""
    if self._fd is not None:
      os.ftruncate(self._fd, 0)
      self._blocks.forget()

  def flush(self) -> None:
    """Nothing to do: each ``write`` hands its rows to the file."""

  def close(self) -> None:
    """Closes the file; closing twice does nothing."""
    self._fd = None
    self._closer()  # closes the file once


def for_run(run_dir: pathlib.Path, append: bool = False) -> JsonlWriter:
  """The writer of ``Run(writers=["jsonl"])``: ``<run_dir>/metrics.jsonl``,
  started afresh or (``append``) gone on with."""
  return JsonlWriter(run_dir / "metrics.jsonl", append=append)
