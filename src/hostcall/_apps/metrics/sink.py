"""The host side of a run (``RunSink``), and the runs open in this process.

A ``Run``'s log taps hand their rows to its sink, which counts them and
puts them on the writer thread; the writer thread hands them back to the
sink's ``write`` (the ``writer_thread.Sink`` interface), which gives them to
the writers. Open sinks are kept by directory: a new run of the same
directory (``Run(exists="append")`` or ``"overwrite"``) replaces the open
one once its own writers are made (its successor takes what is still
logged to it; a run that fails to open hands it back), every
``hostcall.barrier()`` flushes them all, and interpreter exit closes them.

``finish_abandoned`` finishes (flushes and closes) the open runs nothing
can log to any more (``RunSink.in_use``), when a run is made and at each
barrier: a run made again and again (a notebook cell run again) leaves one
run open, not one a time.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import logging
import os
import pathlib
import threading
from typing import Any, Iterable

import numpy as np

from hostcall._apps.metrics import (config as _config, files as _files,
                                    interleaved_rows,
                                    processes as _processes, registry,
                                    writer_thread)
from hostcall._apps.metrics.block import Block
from hostcall._apps.metrics import open_runs
from hostcall._apps.metrics.users import Users
from hostcall._runtime import errors

logger = logging.getLogger("hostcall")

_ids = itertools.count()


class RunSink:
  """Where a run's rows go on the host: counted as they are put, written by
  the writer thread to the run's writers, waited for by ``drain``.

  Arguments:
    name: the run's name.
    run_dir: the run's directory.
    specs: the writers, as ``Run(writers=...)`` takes them (names or
      ``Writer`` instances).
    params: the run's config when it opens (JSON values), handed to every
      writer (``Writer.write_config``) and to those that take it when made.
    processes: who writes in a job of several processes (one of
      ``processes.MODES``).
    job: the job's processes.
    exists: what to do with the files an earlier run left in ``run_dir``
      (``"append"``, ``"overwrite"``, or ``"new"``: there are none).
    channel: the run's key prefix in a job of several processes
      (``processes.channel``, taken once a run), or None to take it here.
    owner: the ``Run`` whose sink this is (in ``users``, held weakly).
    dir_made: ``run_dir`` was made for this run (removed, emptied of the
      files its writers made, if the run fails to open).

  Attributes:
    id: a number no other sink of this process has.
    name, dir: the run's name and directory.
    writers: the run's writers (a list that ``Run.writers`` shares).
    successor: the sink that replaced this one (a new run of the same
      directory), or None.
    closed: whether rows are refused.
    users: what can log to it (``Users``).
    config: the run's config (``Run.config``), read and changed holding
      ``config_lock``.
    tally: how many puts the writer thread has written.
    process: the ``process`` column of this process's rows (None in a job
      of one process).
  """

  #: How long process 0 of a gathered run waits, at close, for the other
  #: processes to close theirs.
  GATHER_TIMEOUT = 300.0

  def __init__(self, name: str, run_dir: pathlib.Path, specs: Iterable,
               params=None, processes: str = "each",
               job: _processes.Job = _processes.Job(None, 1),
               exists: str = "overwrite", channel: str | None = None,
               owner=None, dir_made: bool = False):
    self.id = next(_ids)
    self.name = name
    self.dir = run_dir
    self.pid = os.getpid()  # a forked child's copy is not its run
    self.successor: RunSink | None = None
    self.lock = threading.Lock()
    self.tally = writer_thread.Tally(self.lock)
    self.closed = False
    self.writers: list = []
    self.latest: dict[str, tuple[int, Any]] = {}
    self._next_step = 0
    self._put_count = 0
    # The writer thread writes this sink's blocks once its writers are open
    # (after the sink it replaces has written its last row).
    self._ready = threading.Event()
    self._parked: list = []
    self._writers_closed = False
    self.process = job.process
    self._gather: _processes.Gather | None = None
    self._checked: set = set()  # the metrics' names and shapes checked
    self.config: dict = dict(params or {})
    self.config_lock = threading.Lock()
    self._channel = channel
    self.users = Users(owner)
    self._all_users = [self.users]  # and those of the sinks it replaced
    made: list = []  # the writers this sink made itself (not the user's)
    replaced: list[RunSink] = []
    created = dir_made  # whether the run's directory was made for it
    try:
      # Everything that can fail before a file is touched (a bad spec, a
      # missing extra, a tracking tool refusing to start, a file where the
      # directory should be) fails first, while an open run of the same
      # directory is untouched; the files an earlier run left are kept
      # until every writer is made ("overwrite" empties them only then).
      plan = self._plan(specs, params, processes, job, exists != "new")
      writers: list = [None] * len(plan)
      if any(files for _, files, _ in plan):
        created = created or not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
      for index, (make, files, ours) in enumerate(plan):
        if not files:
          writers[index] = make()
          if ours:
            made.append(writers[index])
      replaced = self._replace_open_runs()
      for old in replaced:
        old.drain()  # its rows written: its writers idle from now on
      # The file writers last, once the replaced run's are idle (one
      # writer per file at a time); the replaced run's writers are closed
      # only once these are made, so that a failure can hand it back.
      for index, (make, files, ours) in enumerate(plan):
        if files:
          writers[index] = make()
          if ours:
            made.append(writers[index])
      self.writers[:] = writers
      if job.process == 0 and processes == "gather":
        self._gather = _processes.Gather(job.client, self._channel,
                                         job.count, self.put)
      if exists == "overwrite":
        _start_afresh(made)
      if self.config:  # (before the writer thread hands them a row)
        self._each_writer("check_config", self.config)
        self._each_writer("write_config", self.config)
    except BaseException:
      self._undo_open(replaced, made, created)
      raise
    finally:
      self._ready.set()
      writer_thread.shared.put(self, writer_thread.RESUME)
    for old in replaced:  # this run is open: the one it replaced closes
      try:
        old.close_writers()
      except Exception as exc:  # noqa: BLE001 - this run is open all the same
        errors.postpone(exc, f"closing the writers of {old!r}, replaced")

  def _replace_open_runs(self) -> list:
    """Registers this sink as open; the open runs of its directory
    (re-created) hand their rows, and their ``Run`` objects, to it."""
    with open_runs.LOCK:
      replaced = [s for s in open_runs.OPEN if s.successor is None
                  and s.dir.resolve() == self.dir.resolve()]
      for old in replaced:
        with old.lock:
          old.successor = self  # from now on, its rows come here
          self._all_users += old._all_users  # its Run logs here now
      open_runs.OPEN.append(self)
    return replaced

  def _undo_open(self, replaced: list, made: list, created: bool) -> None:
    """A run that failed to open leaves nothing open: the runs it replaced
    take their rows back, the writers it made are closed, and the
    directory made for it (and the files made in it) removed."""
    self.closed = True
    self._writers_closed = True
    if replaced:  # the replaced run takes its rows again, and ours
      self.writers[:] = replaced[0].writers
      for old in replaced:
        with old.lock:
          old.successor = None
    for writer in made:
      try:
        writer.close()
      except Exception:  # noqa: BLE001 - the first failure is raised
        logger.debug("hostcall: closing %r of a run that failed to open",
                     writer, exc_info=True)
    if created:
      _files.remove_made(self.dir, [self.dir / _config.FILE] + [
          getattr(writer, "path", None) for writer in made])
    with open_runs.LOCK:
      if self in open_runs.OPEN:
        open_runs.OPEN.remove(self)

  def __repr__(self):
    return f"hostcall.metrics.Run({self.name!r}, dir={str(self.dir)!r})"

  def _plan(self, specs, params, processes, job, append) -> list:
    """How to make the writers of this process: ``(make, files, ours)``
    for each, in order (``make()`` returns the writer; ``files``: it writes
    files in the run's directory; ``ours``: made here, not the user's). The
    run's own writers, or (a process other than 0 where only process 0
    writes) one that sends rows to process 0, or none."""
    def named(spec, name):
      return (registry.maker(spec, self.dir, name, params, append),
              registry.writes_files(spec), isinstance(spec, str))

    if job.process is None:
      return [named(w, self.name) for w in specs]
    # Every process numbers its runs of a name alike, whatever it writes.
    if self._channel is None:
      self._channel = _processes.channel(self.name)
    if processes == "each":  # one MLflow / W&B run a process
      return [named(w, f"{self.name}/process_{job.process}") for w in specs]
    if job.process == 0:
      return [named(w, self.name) for w in specs]
    if processes == "gather":
      channel = f"{self._channel}/{job.process}"
      return [(lambda: _processes.ForwardWriter(job.client, channel), False,
               True)]
    return []  # "zero": this process's rows are dropped

  def await_other_processes(self) -> None:
    """In process 0 of a gathered run: waits (``GATHER_TIMEOUT`` at most)
    until every other process has closed its run, so that their rows are
    put before this run closes."""
    gather, self._gather = self._gather, None
    if gather is None:
      return
    missing = gather.wait(self.GATHER_TIMEOUT)
    if missing:
      logger.warning(
          "hostcall: %r closed without the rows of process(es) %s, which "
          "did not close their run within %.0f s (close the run in every "
          "process, before jax.distributed shuts down)", self, missing,
          self.GATHER_TIMEOUT)

  @property
  def in_a_forked_child(self) -> bool:
    """Whether this process is a child forked (``os.fork()``) after the
    run opened: its rows and files are then the parent's."""
    return self.pid != os.getpid()

  def refuse_in_a_forked_child(self, what: str) -> None:
    """Raises ``in_a_forked_child`` (a flush there would write the
    parent's buffered rows twice, a wait would wait for rows only the
    parent's writer thread writes)."""
    if self.in_a_forked_child:
      raise RuntimeError(
          f"hostcall.metrics.Run({self.name!r}) was opened by process "
          f"{self.pid}; this process ({os.getpid()}) is a child forked from "
          f"it, and cannot {what}: the run's rows and files are the "
          "parent's. Open a new Run in the child, or start workers with the "
          "'spawn' method of multiprocessing (JAX is not fork-safe either).")

  def current(self) -> "RunSink":
    """The sink that takes this one's rows now: itself, or the last of its
    successors."""
    sink = self
    while sink.successor is not None:
      sink = sink.successor
    return sink

  def in_use(self) -> bool:
    """Whether anything can still log to this sink (its ``users``, and
    those of the sinks it replaced): a ``Run`` object whose rows come here
    alive, a call site traced for it still registered (the executables
    compiled from it alive, or its taps not all delivered), or a call made
    outside ``jit`` not yet delivered."""
    with Users.lock:
      in_use = [users.alive() for users in self._all_users]
      # (a replaced sink's users only die: forgotten once all have)
      self._all_users[1:] = [u for u, alive in zip(self._all_users[1:],
                                                   in_use[1:]) if alive]
      return any(in_use)

  def _each_writer(self, method: str, *args) -> None:
    """Calls ``method`` of each writer that has it (a copy of each
    argument each), raising the first failure."""
    for writer in self.writers:
      call = getattr(writer, method, None)
      if callable(call):
        call(*(dict(a) for a in args))

  def check_metrics(self, shapes: dict[str, tuple],
                    texts: dict[str, str] | None = None,
                    paths: dict[str, tuple] | None = None) -> None:
    """Has each writer refuse, when a ``Run.log`` call is traced, what it
    could not keep (``Writer.check_metrics``, given ``texts=`` and
    ``paths=`` where it takes them; ``Writer.check_texts``), once."""
    texts, paths = texts or {}, paths or {}
    key = tuple(tuple(d.items()) for d in (shapes, texts, paths))
    if key in self._checked:
      return
    for writer in self.writers:
      check = getattr(writer, "check_metrics", None)
      if callable(check):  # (texts= and paths= where it takes them)
        takes = inspect.signature(check).parameters
        check(dict(shapes), **{k: dict(v) for k, v in (
            ("texts", texts), ("paths", paths)) if k in takes})
    if texts:
      self._each_writer("check_texts", texts)
    self._checked.add(key)

  def update_config(self, changes: dict) -> None:
    """Has each writer check ``changes`` (``Writer.check_config``), then
    keeps them and hands the whole config to the writers, after the rows
    put before (called holding ``config_lock``)."""
    if self.current().closed:
      raise RuntimeError(f"{self!r} is closed; its config can no longer "
                         "change. Open a new Run (params=...).")
    self._each_writer("check_config", changes)
    self.config.update(changes)
    self.put(_config.Update(copy.deepcopy(self.config)))

  # From the taps' delivery ------------------------------------------------

  def take_steps(self, count: int) -> np.ndarray:
    """The next ``count`` step numbers of a run logged without steps."""
    with self.lock:
      first, self._next_step = self._next_step, self._next_step + count
    return np.arange(first, first + count, dtype=np.int64)

  def first_step(self, count: int) -> int:
    """The first of the next ``count`` step numbers of a run logged
    without steps (``take_steps`` without the array)."""
    with self.lock:
      first = self._next_step
      self._next_step = first + count
    return first

  def note_latest(self, step: int, values: dict) -> None:
    """Keeps ``step`` and each metric's last value, for ``Run.latest``."""
    latest = self.current().latest
    for name, value in values.items():
      latest[name] = (step, value)

  def put(self, block: Block) -> None:
    """Counts ``block`` in (to the current sink) and hands it to the writer
    thread; raises if the run is closed. The rows this thread noted
    and has not put yet (``interleaved_rows``) go first."""
    interleaved_rows.put_pending()
    sink = self.current()
    while True:
      with sink.lock:
        if sink.successor is None:  # still the current sink: count it in
          closed = sink.closed
          if not closed:
            sink._put_count += 1
          break
      sink = sink.current()
    if closed:
      what = ("a config change was" if isinstance(block, _config.Update)
              else f"{len(block)} row(s) were")
      raise RuntimeError(
          f"{what} logged to {sink!r} after it was closed, "
          "by a function compiled while it was open; they were dropped. "
          "Open a new Run (or close this one after the last log).")
    writer_thread.shared.put(sink, block)

  # On the writer thread ---------------------------------------------------

  def write(self, block, count: int = 1) -> int:
    """Writes ``block``, the rows of ``count`` puts (on the writer thread);
    returns how many puts are written now, for the writer thread to add to
    ``tally``. Blocks that come before the sink's writers are open (the
    replaced sink still writing its last rows) wait, in order, for
    ``writer_thread.RESUME``."""
    if block is writer_thread.RESUME:
      parked, self._parked = self._parked, []
      return sum(self._write_now(*waiting) for waiting in parked)
    if not self._ready.is_set() or self._parked:
      self._parked.append((block, count))
      return 0
    return self._write_now(block, count)

  def _write_now(self, block, count: int = 1) -> int:
    config = block.config if isinstance(block, _config.Update) else None
    for writer in self.writers:
      try:
        if config is None:
          writer.write(block)
        elif callable(getattr(writer, "write_config", None)):
          writer.write_config(dict(config))
      except BaseException as exc:  # noqa: BLE001 - others still write
        errors.postpone(exc, f"metrics writer {writer!r}")
    return count

  # From the run's owner ---------------------------------------------------

  def drain(self) -> None:
    """Waits until every block put so far is written, then flushes the
    writers (their failures postponed to the next barrier)."""
    with self.lock:
      target = self._put_count
    with writer_thread.shared.waited_for():
      self.tally.wait_for(target)
    if self._writers_closed:  # read after close: nothing left to flush
      return
    for writer in self.writers:
      try:
        writer.flush()
      except BaseException as exc:  # noqa: BLE001
        errors.postpone(exc, f"flushing metrics writer {writer!r}")

  def close(self) -> None:
    """Refuses rows from now on, writes what was put, closes the writers.
    Process 0 of a gathered run first waits for the other processes."""
    self.await_other_processes()
    with self.lock:
      self.closed = True  # rows logged from now on are refused, and said so
    self.drain()
    self.close_writers()

  def close_writers(self) -> None:
    """Closes the writers once (raising the first failure, after closing
    every one) and forgets the sink."""
    with self.lock:
      self.closed = True
      if self._writers_closed:
        return
      self._writers_closed = True
    with open_runs.LOCK:
      if self in open_runs.OPEN:
        open_runs.OPEN.remove(self)
    failures = []
    for writer in self.writers:
      try:
        writer.close()
      except BaseException as exc:  # noqa: BLE001 - close every writer
        failures.append(exc)
    if failures:
      raise failures[0]


def _start_afresh(writers: list) -> None:
  """The files an earlier run left, emptied by the writers that made them
  (``exists="overwrite"``), once every writer is made."""
  for writer in writers:
    start_afresh = getattr(writer, "start_afresh", None)
    if start_afresh is not None:
      start_afresh()
