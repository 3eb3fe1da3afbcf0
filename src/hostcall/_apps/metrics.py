"""Metric logging from inside compiled JAX programs.

``Run.log`` stages one asynchronous tap; on the host the values become a
``writers.Block`` (one row per step and vmap member) that the run's writer
thread hands to each writer. Inside ``hostcall.scan`` (and the progress
loops built on it) the tap is buffered: one host call brings ``every``
steps, written as one block.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import itertools
import logging
import math
import os
import pathlib
import threading
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from hostcall._apps import writers as _writers
from hostcall._apps.writer_thread import _RESUME, _writer_thread
from hostcall._async import queue as _queue
from hostcall._core import TapTarget, bind, errors
from hostcall._core.context import why_waiting_is_forbidden
from hostcall._core.barriers import add_barrier_hook
from hostcall._core import target as _target
from hostcall._core.checks import describe_leaf, is_array_like

logger = logging.getLogger("hostcall")

_run_ids = itertools.count()
_open_runs: list["Run"] = []
_runs_lock = threading.Lock()


@_target
class _LogTarget(TapTarget):
  """The host side of one ``Run.log`` call site."""

  run: "Run" = dataclasses.field(compare=False)
  run_id: int
  names: tuple
  has_step: bool

  delivery = "async"  # the device never waits for the writers
  remat = "once"  # a rematerialised step must not log its rows twice

  def __repr__(self):
    return f"metrics.Run({self.run.name!r}).log{self.names}"

  def deliver(self, flat_args, context):
    self._add(flat_args, context, steps=None)
    return ()

  def deliver_steps(self, stacked, steps, context):
    self._add(stacked, context, steps=steps)

  def _add(self, args, context, steps: int | None) -> None:
    run = self.run._current()
    batch_rank = len(context.batch_levels) if context else 0
    lanes = math.prod(np.shape(args[0])[:batch_rank]) if args else 1
    rows = lanes * (steps or 1)

    def rows_first(a):
      a = np.asarray(a)
      if steps is not None and batch_rank:  # (*batch, K, ...) -> (K, ...)
        a = np.moveaxis(a, batch_rank, 0)
      return a.reshape(rows, *a.shape[batch_rank + (steps is not None):])

    columns = [rows_first(a) for a in args]
    if self.has_step:
      step, *values = columns
      step = step.astype(np.int64)
    else:
      values = columns
      step = np.repeat(run._take_steps(steps or 1), lanes)
    member = (np.tile(np.arange(lanes), steps or 1) if batch_rank else None)
    device = run._device_column(context, rows)
    if rows:
      run._note_latest(int(step[-1]), {name: v[-1] for name, v in zip(
          self.names, values)})
    run._put(_writers.Block(step, dict(zip(self.names, values)), member,
                            device))




def _run_dir(root, name) -> pathlib.Path:
  """``root/name``, refusing a name that is not a plain relative path."""
  if not isinstance(name, str) or not name or "\0" in name:
    raise ValueError(f"a run name is a non-empty string without NUL bytes, "
                     f"e.g. Run('fit'); got {name!r}.")
  relative = pathlib.PurePath(name)
  if relative.is_absolute() or ".." in relative.parts:
    raise ValueError(
        f"a run name is a relative path inside the runs directory ({root}); "
        f"got {name!r}, which would write elsewhere. Pass root= to choose "
        "the directory, e.g. Run('fit', root='/data/runs').")
  root = _writers.as_path(root, "Run's root")
  path = root / relative
  if not path.resolve().is_relative_to(root.resolve()):
    raise ValueError(f"the run name {name!r} leads outside {root} (through "
                     "a symbolic link); choose another name or root=.")
  return path



_INDEX_COLUMNS = frozenset({"member", "device"})


def _describe(value) -> str:
  if hasattr(value, "shape") and hasattr(value, "dtype"):
    return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
  return describe_leaf(value)


class Run:
  """A named run whose metrics are logged from inside ``jit``, ``scan``,
  ``vmap`` and ``grad``, without the device waiting for the disk.

  Arguments:
    name: the run's name, a relative path; files go to ``<root>/<name>/``.
    root: the directory of runs (default ``runs``).
    writers: where rows go: ``"jsonl"`` (``metrics.jsonl``, the default),
      ``"csv"`` (``metrics.csv``), ``"tensorboard"`` (event files in
      ``tensorboard/``, needs ``tensorboardX``), ``"memory"`` (kept for
      ``dataframe()``), or ``hostcall.metrics.Writer`` instances.

  A run starts its files afresh. Rows reach the files at every
  ``hostcall.barrier()``, ``run.flush()``, ``run.close()`` and at exit.
  Under ``vmap`` each member's values form their own row, with its
  ``member`` index (row-major over nested vmaps). Where JAX sees several
  devices, rows carry the ``device`` id that logged them (under
  ``shard_map`` and ``pmap`` each device logs its own values). In a job of
  several processes give each process its own run name.

  Creating a run of the same directory as a run still open in this process
  (a notebook cell run again) replaces it: the old run is flushed and
  closed, and whatever still logs to the old object (a function compiled
  before) logs to the new run.

  Example:
    >>> import jax, jax.numpy as jnp, hostcall
    >>> run = hostcall.metrics.Run("doc", writers=["memory"])
    >>> def step(w, x):
    ...   loss = (w * x - 1.0) ** 2
    ...   run.log(loss=loss)
    ...   return w - 0.1 * jax.grad(lambda w: (w * x - 1.0) ** 2)(w), loss
    >>> _ = jax.jit(lambda w: jax.lax.scan(step, w, jnp.ones(3)))(0.0)
    >>> run.dataframe()
       step    loss
    0     0  1.0000
    1     1  0.6400
    2     2  0.4096
  """

  def __init__(self, name: str = "run", root: str | os.PathLike = "runs",
               writers: Iterable = ("jsonl",)):
    if isinstance(writers, (str, _writers.Writer)):
      writers = [writers]
    writers = list(writers)
    self.id = next(_run_ids)
    self.name = name
    self.dir = _run_dir(root, name)
    self._successor: Run | None = None
    self._next_step = 0
    self._lock = threading.Lock()
    self._put_count = 0
    self._tally = _Tally(self._lock)
    self._closed = False
    self.writers: list = []
    # The writer thread writes this run's blocks once its writers are open
    # (after the run it replaces has written its last row).
    self._ready = threading.Event()
    self._parked: list = []
    self._latest: dict[str, tuple[int, Any]] = {}
    with _runs_lock:
      replaced = [r for r in _open_runs if r._successor is None
                  and r.dir.resolve() == self.dir.resolve()]
      for old in replaced:
        with old._lock:
          old._successor = self  # from now on, its rows come here
      _open_runs.append(self)
    try:
      for old in replaced:
        old._retire()  # one writer per file, never two
      self.writers = [_writers.make(w, self.dir) for w in writers]
    except BaseException:
      self._closed = True
      with _runs_lock:
        if self in _open_runs:
          _open_runs.remove(self)
      raise
    finally:
      self._ready.set()
      _writer_thread.put(self, _RESUME)

  def __repr__(self):
    return f"hostcall.metrics.Run({self.name!r}, dir={str(self.dir)!r})"

  def _current(self) -> "Run":
    run = self
    while run._successor is not None:
      run = run._successor
    return run

  def log(self, step=None, **metrics) -> None:
    """Logs ``metrics`` (scalars or small arrays) at ``step``.

    Arguments:
      step: the step number (an integer scalar, traced or not; under
        ``vmap``, one per member), positional or ``step=``; None numbers
        the calls of this run on the host 0, 1, 2, ...
      **metrics: name=value; JAX arrays, NumPy arrays of numbers or
        booleans, or Python numbers (not text: refused). Any
        string but ``member`` and ``device`` (columns hostcall fills) is a
        valid name.

    Works inside and outside ``jit``; returns nothing. The values reach the
    writers asynchronously (see ``hostcall.set_delivery``).
    """
    run = self._current()
    if run._closed:
      raise RuntimeError(f"{run!r} is closed; open a new Run to log more.")
    if not metrics:
      raise TypeError("Run.log needs at least one metric, e.g. "
                      "run.log(step, loss=loss).")
    names = tuple(metrics)
    reserved = sorted(set(names) & _INDEX_COLUMNS)
    if reserved:
      raise ValueError(
          f"the metric name(s) {reserved} are columns hostcall fills itself "
          "(the vmap member and the device of each row); choose another "
          f"name, e.g. run.log({reserved[0]}_id=...).")
    for name, value in metrics.items():
      if not is_array_like(value):
        raise TypeError(
            f"metric {name!r}: expected a JAX array, a NumPy array of "
            f"numbers or booleans, or a Python number, got "
            f"{describe_leaf(value)}. Log numbers; put text in the run name "
            "or a separate file.")
    operands = [jnp.asarray(v) for v in metrics.values()]
    if step is not None:
      if not is_array_like(step) or not jnp.issubdtype(
          jnp.result_type(step), jnp.integer) or jnp.ndim(step) != 0:
        raise TypeError(
            "step must be one integer (traced or not; under vmap, one per "
            f"member), got {_describe(step)}: run.log(step, loss=...). To "
            "log a vector of values per step, log it as a metric.")
      operands.insert(0, jnp.asarray(step))
    log_target = _LogTarget(run, run.id, names, step is not None)
    bind(operands, target=log_target, kind="call",
         delivery=log_target.delivery)

  def flush(self) -> None:
    """Waits for the computations running, then writes every row logged so
    far to the writers' files."""
    inside = why_waiting_is_forbidden()
    if inside is not None:
      raise RuntimeError(
          f"Run.flush() / close() / dataframe() was called from inside "
          f"{inside}, where it would wait for the computation (or thread) "
          "running it. Call it after the JAX call returns.")
    _queue.wait()
    self._current()._drain()

  def close(self) -> None:
    """Flushes and closes the writers; later ``log`` calls raise."""
    run = self._current()
    if run._closed:
      return
    run.flush()
    with run._lock:
      run._closed = True  # rows logged from now on are refused, and said so
    run._drain()
    run._close_writers()

  def _close_writers(self) -> None:
    with self._lock:
      self._closed = True
    with _runs_lock:
      if self in _open_runs:
        _open_runs.remove(self)
    failures = []
    for writer in self.writers:
      try:
        writer.close()
      except BaseException as exc:  # noqa: BLE001 - close every writer
        failures.append(exc)
    if failures:
      raise failures[0]

  def _retire(self) -> None:
    """Writes what this run (replaced by a new one) was handed and closes
    its writers; what it is handed later goes to its successor."""
    try:
      self._drain()
    finally:
      self._close_writers()

  def __enter__(self) -> "Run":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def records(self) -> list[dict[str, Any]]:
    """Every row logged so far, as dicts (after a flush)."""
    self.flush()
    run = self._current()
    for writer in run.writers:
      if isinstance(writer, _writers.MemoryWriter):
        return writer.records()
    return _writers.read_records(run.dir)

  def dataframe(self):
    """Every row logged so far as a pandas DataFrame (after a flush)."""
    return _writers.to_dataframe(self.records())

  def latest(self, name: str) -> tuple[int, Any] | None:
    """``(step, value)`` of the last row logged with metric ``name`` that
    has reached the host, or None; never waits (for a ``stop_when``
    predicate, say).

    Example:
      >>> import jax, hostcall
      >>> run = hostcall.metrics.Run("doc-latest", writers=["memory"])
      >>> _ = jax.jit(lambda: [run.log(i, loss=1.0 / (i + 1)) for i in range(3)])()
      >>> hostcall.barrier(); run.latest("loss")
      (2, 0.3333333...)
    """
    if not isinstance(name, str):
      raise TypeError(f"Run.latest takes a metric's name (a str, as given to "
                      f"run.log), got {name!r} of type "
                      f"{type(name).__name__}.")
    found = self._current()._latest.get(name)
    if found is None:
      return None
    step, value = found
    value = np.asarray(value)
    return step, value.item() if value.ndim == 0 else value

  # Host side ---------------------------------------------------------------

  def _note_latest(self, step: int, values: dict) -> None:
    latest = self._current()._latest
    for name, value in values.items():
      latest[name] = (step, value)

  def _take_steps(self, count: int) -> np.ndarray:
    with self._lock:
      first, self._next_step = self._next_step, self._next_step + count
    return np.arange(first, first + count, dtype=np.int64)

  def _device_column(self, context, rows: int) -> np.ndarray | None:
    device = getattr(context, "device", None)
    if device is None or _single_device():
      return None
    return np.full(rows, device.id)

  def _put(self, block: _writers.Block) -> None:
    run = self._current()
    while True:
      with run._lock:
        if run._successor is None:  # still the current run: count it in
          closed = run._closed
          if not closed:
            run._put_count += 1
          break
      run = run._current()
    if closed:
      raise RuntimeError(
          f"{len(block)} row(s) were logged to {run!r} after it was closed, "
          "by a function compiled while it was open; they were dropped. "
          "Open a new Run (or close this one after the last log).")
    _writer_thread.put(run, block)

  def _write(self, block, count: int = 1) -> int:
    """Writes ``block``, the rows of ``count`` puts (in the writer thread);
    returns how many puts are written now, for the writer thread to add to
    ``_tally``. Blocks that come before the run's writers are open (the
    replaced run still writing its last rows) wait, in order, for
    ``_RESUME``."""
    if block is _RESUME:
      parked, self._parked = self._parked, []
      return sum(self._write_now(*waiting) for waiting in parked)
    if not self._ready.is_set() or self._parked:
      self._parked.append((block, count))
      return 0
    return self._write_now(block, count)

  def _write_now(self, block, count: int = 1) -> int:
    for writer in self.writers:
      try:
        writer.write(block)
      except BaseException as exc:  # noqa: BLE001 - others still write
        errors.postpone(exc, f"metrics writer {writer!r}")
    return count

  def _drain(self) -> None:
    tally = self._tally
    with tally.changed:
      target = self._put_count
      tally.changed.wait_for(lambda: tally.written >= target)
    for writer in self.writers:
      try:
        writer.flush()
      except BaseException as exc:  # noqa: BLE001
        errors.postpone(exc, f"flushing metrics writer {writer!r}")


class _Tally:
  """How many of a run's puts are written. The writer thread counts them
  here after letting go of the run, so that a run closed and dropped by its
  owner is released by the time ``close()`` returns."""

  __slots__ = ("changed", "written")

  def __init__(self, lock):
    self.changed = threading.Condition(lock)  # the run's lock
    self.written = 0

  def add(self, count: int) -> None:
    with self.changed:
      self.written += count
      self.changed.notify_all()


@functools.cache
def _single_device() -> bool:
  return jax.device_count() == 1


def read(path: str | os.PathLike):
  """A run's rows as a pandas DataFrame.

  Arguments:
    path: a run directory (``runs/<name>``) or its ``metrics.jsonl`` /
      ``metrics.csv``.

  Returns:
    A DataFrame with ``step`` (and ``member``, ``device`` where logged) and
    one column per metric.

  Rows cut off mid-write (a process killed while writing) are skipped, with
  an ``IncompleteRowsWarning`` naming their lines.

  Example:
    >>> import jax, hostcall, tempfile
    >>> run = hostcall.metrics.Run("read", root=tempfile.mkdtemp())
    >>> _ = jax.jit(lambda: run.log(0, loss=0.5))()
    >>> run.close()
    >>> hostcall.metrics.read(run.dir)["loss"].tolist()
    [0.5]
  """
  return _writers.to_dataframe(_writers.read_records(path))


def _flush_all() -> None:
  for run in list(_open_runs):
    run._drain()


def _close_all_at_exit() -> None:
  if not _open_runs:
    return
  try:
    _queue.wait()
  finally:
    for run in list(_open_runs):
      try:  # one run's failure (a full disk) never costs another its rows
        run._drain()
        run._close_writers()
      except BaseException:  # noqa: BLE001
        logger.exception("hostcall: closing %r at exit failed", run)


def _forget_runs_in_a_forked_child() -> None:
  # The open runs, their rows and files are the parent's: a forked child's
  # exit must not wait for the parent's writer thread, which it lacks, nor
  # close the parent's files. (No lock is taken: one a parent's thread held
  # at the fork stays held in the child for good.)
  _open_runs.clear()
  _writer_thread.__init__()


add_barrier_hook(_flush_all)
atexit.register(_close_all_at_exit)
os.register_at_fork(after_in_child=_forget_runs_in_a_forked_child)
