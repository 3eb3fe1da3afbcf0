"""Metric logging from inside compiled JAX programs.

``Run.log`` stages one asynchronous tap; on the host the values become a
``writers.Block`` (one row per step and vmap member) that the run's writer
thread hands to each writer. Inside ``hostcall.scan`` (and the progress
loops built on it) the tap is buffered: one host call brings ``every``
steps, written as one block.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import math
import os
import pathlib
import queue
import threading
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from hostcall._apps import writers as _writers
from hostcall._core import bind, errors, host

_run_ids = itertools.count()
_open_runs: list["Run"] = []


class _LogTarget(host.HostTarget):
  """The host side of one ``Run.log`` call site."""

  delivery = "async"  # the device never waits for the writers
  remat = "once"  # a rematerialised step must not log its rows twice

  def __init__(self, run: "Run", names: tuple[str, ...], has_step: bool):
    super().__init__(("metrics", run.id, names, has_step))
    self.run, self.names, self.has_step = run, names, has_step

  def __repr__(self):
    return f"metrics.Run({self.run.name!r}).log{self.names}"

  def vmap_method(self) -> str:
    return "broadcast_all"  # every member's values, batch axes in front

  def check_differentiable(self) -> None:
    return None  # a log has no results to differentiate

  def deliver(self, flat_args, context):
    self._add(flat_args, context, steps=None)
    return ()

  def deliver_steps(self, stacked, steps, context):
    self._add(stacked, context, steps=steps)

  def _add(self, args, context, steps: int | None) -> None:
    batch_rank = len(context.batch_levels) if context else 0
    lanes = math.prod(np.shape(args[0])[:batch_rank]) if args else 1
    rows = lanes * (steps or 1)

    def rows_first(a):
      a = np.asarray(a)
      if steps is not None:  # (*batch, K, ...) -> (K, *batch, ...)
        a = np.moveaxis(a, batch_rank, 0)
      return a.reshape(rows, *a.shape[batch_rank + (steps is not None):])

    columns = [rows_first(a) for a in args]
    if self.has_step:
      step, *values = columns
      step = step.astype(np.int64)
    else:
      values = columns
      step = np.repeat(self.run._take_steps(steps or 1), lanes)
    member = (np.tile(np.arange(lanes), steps or 1) if batch_rank else None)
    device = self.run._device_column(context, rows)
    self.run._put(_writers.Block(step, dict(zip(self.names, values)),
                                 member, device))


class _Writers:
  """The one thread that hands blocks to every run's writers, so that a
  slow disk never slows the device nor the delivery of other callbacks (and
  runs left open cost no thread each)."""

  def __init__(self):
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self._lock = threading.Lock()
    self._thread: threading.Thread | None = None

  def put(self, run: "Run", block) -> None:
    with self._lock:
      if self._thread is None:
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="hostcall-metrics-writer")
        self._thread.start()
    self._queue.put((run, block))

  def _loop(self) -> None:
    while True:
      run, block = self._queue.get()
      try:
        run._write(block)
      except BaseException:  # noqa: BLE001 - the writer thread never dies
        host.logger.exception("hostcall: metrics writing failed")


_writer_thread = _Writers()


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
  root = pathlib.Path(root)
  path = root / relative
  if not path.resolve().is_relative_to(root.resolve()):
    raise ValueError(f"the run name {name!r} leads outside {root} (through "
                     "a symbolic link); choose another name or root=.")
  return path


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
    self.id = next(_run_ids)
    self.name = name
    self.dir = _run_dir(root, name)
    self._successor: Run | None = None
    for old in [r for r in _open_runs if r.dir.resolve() == self.dir.resolve()]:
      old._hand_over(self)  # one writer per file, never two
    self.writers = [_writers.make(w, self.dir) for w in writers]
    self._next_step = 0
    self._lock = threading.Lock()
    self._written = threading.Condition(self._lock)
    self._put_count = self._done_count = 0
    self._closed = False
    _open_runs.append(self)

  def __repr__(self):
    return f"hostcall.metrics.Run({self.name!r}, dir={str(self.dir)!r})"

  def _current(self) -> "Run":
    run = self
    while run._successor is not None:
      run = run._successor
    return run

  def log(self, step=None, /, **metrics) -> None:
    """Logs ``metrics`` (scalars or small arrays) at ``step``.

    Arguments:
      step: the step number (an int or an integer array, traced or not);
        None numbers the calls of this run on the host 0, 1, 2, ...
      **metrics: name=value; JAX or NumPy arrays or Python numbers. Any
        string is a valid name.

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
    for name, value in metrics.items():
      if not host.is_array_like(value):
        raise TypeError(
            f"metric {name!r}: expected a JAX or NumPy array or a Python "
            f"number, got {value!r} of type {type(value).__name__}. Log "
            "numbers; put text in the run name or a separate file.")
    operands = [jnp.asarray(v) for v in metrics.values()]
    if step is not None:
      if not host.is_array_like(step) or not jnp.issubdtype(
          jnp.result_type(step), jnp.integer):
        raise TypeError(f"step must be an integer (traced or not), got "
                        f"{step!r}; pass it first: run.log(step, loss=...)")
      operands.insert(0, jnp.asarray(step))
    target = _LogTarget(run, names, step is not None)
    bind(operands, target=target, identity=False, delivery=target.delivery)

  def flush(self) -> None:
    """Waits for the computations running, then writes every row logged so
    far to the writers' files."""
    if host.call_context() is not None:
      raise RuntimeError(
          "Run.flush() / close() / dataframe() was called from inside a host "
          "function, where it would wait for the computation running it. "
          "Call it after the JAX call returns.")
    from hostcall._core import asynchronous
    asynchronous.wait()
    self._current()._drain()

  def close(self) -> None:
    """Flushes and closes the writers; later ``log`` calls raise."""
    run = self._current()
    if run._closed:
      return
    run.flush()
    run._close_writers()

  def _close_writers(self) -> None:
    self._closed = True
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

  def _hand_over(self, successor: "Run") -> None:
    """Flushes and closes this run; what it still gets goes to
    ``successor``."""
    try:
      self._drain()
    finally:
      try:
        self._close_writers()
      finally:
        self._successor = successor

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

  # Host side ---------------------------------------------------------------

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
    with run._lock:
      run._put_count += 1
    _writer_thread.put(run, block)

  def _write(self, block) -> None:
    try:
      for writer in self.writers:
        try:
          writer.write(block)
        except BaseException as exc:  # noqa: BLE001 - others still write
          host.logger.error("hostcall: metrics writer %r failed", writer,
                            exc_info=True)
          host.errors.record(exc, errors.format_safely(exc))
    finally:
      with self._written:
        self._done_count += 1
        self._written.notify_all()

  def _drain(self) -> None:
    with self._written:
      target = self._put_count
      self._written.wait_for(lambda: self._done_count >= target)
    for writer in self.writers:
      try:
        writer.flush()
      except BaseException as exc:  # noqa: BLE001
        host.errors.record(exc, errors.format_safely(exc))


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
  from hostcall._core import asynchronous
  try:
    asynchronous.wait()
  finally:
    for run in list(_open_runs):
      try:  # one run's failure (a full disk) never costs another its rows
        run._drain()
        run._close_writers()
      except BaseException:  # noqa: BLE001
        host.logger.exception("hostcall: closing %r at exit failed", run)


host.add_barrier_hook(_flush_all)
atexit.register(_close_all_at_exit)
