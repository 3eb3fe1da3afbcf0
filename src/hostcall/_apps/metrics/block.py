"""``Block``: the rows a metrics writer receives, and its columns' values.

A block holds columns of equal length, one row per logged step (and vmap
member). The writer thread joins the blocks waiting for it that share their
columns (``columns_of``, ``concatenate``); writers turn the columns into
values every format can hold (``plain``, ``python_values``,
``column_texts``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import ml_dtypes
import numpy as np

from hostcall._runtime import texts as texts_module


@dataclasses.dataclass
class Block:
  """Rows of metrics: ``step`` and the optional ``process`` / ``member`` /
  ``device`` columns, and one column per metric (first axis: the rows).

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
      shape after the first axis; a text value's column is NumPy text,
      dtype ``str``). Any string but the index columns' names (``step``,
      ``process``, ``member``, ``device``) is a name.
    member: the vmap member of each row (row-major over nested vmaps), or
      None outside ``vmap``.
    device: the id of the device that logged each row, or None where JAX
      sees a single device.
    process: the JAX process (``jax.process_index()``) that logged each
      row, or None in a job of one process.

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
  process: np.ndarray | None = None

  def __len__(self) -> int:
    return len(self.step)

  @property
  def nbytes(self) -> int:
    """The bytes its arrays hold."""
    columns = [self.step, self.process, self.member, self.device,
               *self.metrics.values()]
    return sum(np.asarray(c).nbytes for c in columns if c is not None)

  def index_columns(self) -> dict[str, np.ndarray]:
    """The columns that say where each row comes from.

    Returns:
      ``{"step": ...}``, with ``"process"``, ``"member"`` and ``"device"``
      where present, in that order: what a writer puts before the metrics.
    """
    columns = {"step": self.step}
    if self.process is not None:
      columns["process"] = self.process
    if self.member is not None:
      columns["member"] = self.member
    if self.device is not None:
      columns["device"] = self.device
    return columns

  def records(self) -> list[dict[str, Any]]:
    """The rows as dicts of Python values (arrays become nested lists).

    Returns:
      One dict a row: the index columns (``step``, ``process``, ``member``,
      ``device`` where present), then the metrics. Booleans become 0/1, complex
      numbers their magnitude, small integer and float types of
      ``ml_dtypes`` Python ints and floats.
    """
    columns = {**self.index_columns(), **self.metrics}
    lists = {name: python_values(values) for name, values in columns.items()}
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
      device=None if first.device is None else joined(lambda b: b.device),
      process=None if first.process is None else joined(lambda b: b.process))


def is_text(values: np.ndarray) -> bool:
  """Whether ``values`` is a column of text (a text value ``Run.log``
  logged: ``run.log({"phase": "train"})``)."""
  return np.asarray(values).dtype.kind == "U"


def constant_text(values: np.ndarray) -> str | None:
  """The one text of a text column whose rows all hold it (a call's text
  value), or None."""
  if not is_text(values) or values.ndim != 1 or not len(values):
    return None
  first = values[0]
  return str(first) if bool(np.all(values == first)) else None


def plain(values: np.ndarray) -> np.ndarray:
  """``values`` as integers or IEEE floats, which every format can hold;
  text as it is."""
  if values.dtype.kind == "U":
    return values
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


def python_values(values: np.ndarray) -> list:
  """``values`` as (nested) lists of Python numbers, as ``plain`` has them."""
  return plain(values).tolist()


_JSON_NONFINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def column_texts(values: np.ndarray, json_style: bool) -> list[str]:
  """One text per row of a scalar column, floats in their shortest form for
  their own precision (a float32 0.1 is written ``0.1``)."""
  values = plain(values)
  if values.dtype.kind == "U":  # (JSON escapes what is not ASCII)
    return ([json.dumps(v) for v in values.tolist()] if json_style
            else values.tolist())
  texts = texts_module.column(values, json_style)
  if texts is not None:
    return texts
  texts = values.astype(str).tolist()
  if json_style and np.issubdtype(values.dtype, np.inexact) and \
      not np.isfinite(values).all():
    texts = [_JSON_NONFINITE.get(t, t) for t in texts]
  return texts
