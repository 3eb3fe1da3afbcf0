"""``MemoryWriter``: every row kept in memory (``Run(writers=["memory"])``;
what ``Run.records()`` and ``Run.dataframe()`` read when a run has one)."""

from __future__ import annotations

import pathlib
from typing import Any

from hostcall._apps.metrics import reading
from hostcall._apps.metrics.block import Block
from hostcall._apps.metrics.writer import Writer


class MemoryWriter(Writer):
  """Keeps every row in memory; ``dataframe()`` returns them as a pandas
  DataFrame, ``records()`` as dicts.

  What ``Run(writers=["memory"])`` uses, and what ``Run.records()`` and
  ``Run.dataframe()`` read when the run has one (after flushing the run;
  read the writer itself only after ``hostcall.barrier()`` or
  ``Run.flush()``). Its ``config`` attribute is the run's config, as last
  handed to it.

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
    self.config: dict[str, Any] = {}

  def write_config(self, config: dict[str, Any]) -> None:
    """Keeps the run's config (``config``)."""
    self.config = dict(config)

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
    return reading.to_dataframe(self.records())


def for_run(run_dir: pathlib.Path) -> MemoryWriter:
  """The writer of ``Run(writers=["memory"])`` (which writes no file)."""
  del run_dir
  return MemoryWriter()
