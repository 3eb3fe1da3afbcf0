"""``Table``: runs read back with NumPy alone (``hostcall.metrics.load``):
one NumPy array a column, the rows as dicts, each run's config."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np


class Table:
  """The rows of one run or several, read back with NumPy alone.

  What ``hostcall.metrics.load`` returns. A column is a NumPy array, one
  value a row: ``table["loss"]``. Where some rows lack a metric, a number
  column is ``float64`` with NaN there (as pandas has it); a text column,
  or an array metric, is then an ``object`` array with None there. Integer
  columns (``step``, ``member``, ...) stay ``int64`` where every row has
  them, text is a ``str`` array, and an array metric of one shape in every
  row is one array, a row a step (``table["w"].shape == (rows, 3)``).

  ``len(table)`` is its number of rows, ``table.columns`` (and
  ``iter(table)``, ``table.keys()``) its column names, ``dict(table)`` its
  columns by name. A table of several runs has a ``run`` column first,
  each row's run.

  Attributes:
    columns: the column names: ``run`` (several runs), ``step`` (and
      ``process``, ``member``, ``device`` where logged), then the metrics
      in the order first logged.
    runs: the runs' names, in the order read.
    configs: each run's config (a dict; empty where the run has none), by
      run name.

  Example:
    >>> import jax, hostcall, tempfile
    >>> run = hostcall.metrics.Run("table", root=tempfile.mkdtemp())
    >>> _ = jax.jit(lambda: [run.log(i, loss=1.0 / (i + 1)) for i in range(3)])()
    >>> run.close()
    >>> table = hostcall.metrics.load(run.dir)
    >>> table
    Table(1 run, 3 rows; columns step, loss)
    >>> table["loss"]
    array([1.        , 0.5       , 0.33333334])
  """

  def __init__(self, rows: list[dict[str, Any]], configs: dict[str, dict]):
    self._rows = rows
    self.configs = configs
    self.runs = list(configs)
    names: dict[str, None] = {}
    for row in rows:
      names.update(dict.fromkeys(row))
    self.columns = list(names)
    self._arrays: dict[str, np.ndarray] = {}

  @property
  def config(self) -> dict:
    """The config of a table's one run (``configs`` has every run's)."""
    if len(self.runs) != 1:
      raise ValueError(
          f"this table holds {len(self.runs)} runs, each with its own "
          f"config: read table.configs[run] (runs: {self.runs}).")
    return self.configs[self.runs[0]]

  def __getitem__(self, name: str) -> np.ndarray:
    if name not in self._arrays:
      if name not in self.columns:
        raise KeyError(f"no column {name!r}; the table has "
                       f"{', '.join(map(repr, self.columns)) or 'none'}.")
      self._arrays[name] = column([row.get(name) for row in self._rows])
    return self._arrays[name]

  def __contains__(self, name) -> bool:
    return name in self.columns

  def __len__(self) -> int:
    return len(self._rows)

  def __iter__(self) -> Iterator[str]:
    return iter(self.columns)

  def keys(self) -> list[str]:
    """The column names (``columns``)."""
    return list(self.columns)

  def rows(self) -> list[dict[str, Any]]:
    """The rows, one dict each, with only the columns a row has.

    Returns:
      The rows in the order read (each run's in the order logged), their
      values as read (an array metric a list).
    """
    return [dict(row) for row in self._rows]

  def to_pandas(self):
    """The table as a pandas DataFrame (what ``hostcall.metrics.read``
    returns), the configs in its ``attrs["configs"]``.

    Returns:
      A ``pandas.DataFrame``: a column per column, an array metric's cells
      NumPy arrays.

    Raises:
      ImportError: pandas is not installed (``pip install
        'hostcall[pandas]'``).
    """
    frame = to_dataframe(self._rows)
    frame.attrs["configs"] = self.configs
    return frame

  def __repr__(self) -> str:
    runs = len(self.runs)
    return (f"Table({runs} run{'s' * (runs != 1)}, {len(self)} "
            f"row{'s' * (len(self) != 1)}; columns "
            f"{', '.join(self.columns) or 'none'})")


def column(values: list) -> np.ndarray:
  """``values`` (one a row, None where a row has none) as one NumPy array
  (see ``Table``)."""
  present = [v for v in values if v is not None]
  whole = len(present) == len(values)
  if present and all(isinstance(v, bool) for v in present):
    if whole:
      return np.array(values, bool)
  elif present and all(isinstance(v, (int, float)) for v in present):
    if whole and all(isinstance(v, int) for v in present):
      try:
        return np.array(values, np.int64)
      except OverflowError:  # beyond int64: as floats
        pass
    return np.array([np.nan if v is None else v for v in values], np.float64)
  elif present and all(isinstance(v, str) for v in present):
    if whole:
      return np.array(values, str)
  elif whole and present and all(isinstance(v, list) for v in present):
    try:
      stacked = np.array(values)
    except ValueError:  # of different shapes
      stacked = None
    if stacked is not None and stacked.dtype != object:
      return stacked
  out = np.empty(len(values), object)
  for i, value in enumerate(values):
    out[i] = np.asarray(value) if isinstance(value, list) else value
  return out


def to_dataframe(records: list[dict[str, Any]]):
  """``records`` (dicts, one a row) as a pandas DataFrame whose array
  metrics are NumPy arrays, one a cell."""
  try:
    import pandas as pd
  except ImportError as exc:
    raise ImportError("a DataFrame needs pandas: pip install "
                      "'hostcall[pandas]' (or pip install pandas); without "
                      "it, hostcall.metrics.load(run_dir) reads a run's rows "
                      "as NumPy arrays.") from exc
  frame = pd.DataFrame.from_records(records)
  for name in frame.columns:  # array metrics: one NumPy array a cell
    if frame[name].map(lambda v: isinstance(v, list)).any():
      frame[name] = frame[name].map(
          lambda v: np.asarray(v) if isinstance(v, list) else v)
  return frame
