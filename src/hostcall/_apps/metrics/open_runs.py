"""The runs open in this process: their registry, the runs nothing logs to
any more finished, every run flushed at a barrier and closed at exit, and
a forked child's copy forgotten (the sinks themselves: ``sink``)."""

from __future__ import annotations

import atexit
import logging
import os
import pathlib
import threading

from hostcall._apps.metrics import writer_thread
from hostcall._core.context import why_waiting_is_forbidden
from hostcall._runtime import errors, tap_queue as _queue
from hostcall._runtime.barriers import add_barrier_hook

logger = logging.getLogger("hostcall")

#: The open runs' sinks (``sink.RunSink``), and the lock that guards the list.
OPEN: list = []
LOCK = threading.Lock()


def dirs_in_use() -> set[pathlib.Path]:
  """The directories (resolved) of the runs open in this process."""
  with LOCK:
    return {s.dir.resolve() for s in OPEN
            if s.successor is None and not s.closed}


def finish_abandoned() -> list:
  """Finishes (flushes and closes) the runs open in this process that
  nothing can log to any more (``RunSink.in_use``); returns them. Skipped
  where waiting for the writer thread is not allowed (on it, or in a host
  function), and for process 0 of a gathered run (its close waits for the
  other processes: at its ``close()`` or at exit). A failure to close is
  reported by the next barrier."""
  if why_waiting_is_forbidden() is not None or writer_thread.shared.is_writer:
    return []
  with LOCK:
    candidates = [s for s in OPEN if s.successor is None and not s.closed
                  and s._gather is None and not s.in_a_forked_child]
  finished = []
  for sink in candidates:
    if sink.in_use():
      continue
    with sink.lock:  # one thread finishes it
      if sink.closed or sink.successor is not None:
        continue
      sink.closed = True
    finished.append(sink)
    try:
      sink.drain()
      sink.close_writers()
    except Exception as exc:  # noqa: BLE001 - the next barrier reports it
      errors.postpone(exc, f"finishing {sink!r}, which nothing logs to any "
                      "more")
  return finished


def _flush_all() -> None:
  finish_abandoned()
  for sink in list(OPEN):
    sink.drain()


def _close_all_at_exit() -> None:
  if not OPEN:
    return
  try:
    _queue.wait()
  finally:
    for sink in list(OPEN):
      try:  # one run's failure (a full disk) never costs another its rows
        sink.await_other_processes()
        sink.drain()
        sink.close_writers()
      except BaseException:  # noqa: BLE001
        logger.exception("hostcall: closing %r at exit failed", sink)


def _forget_runs_in_a_forked_child() -> None:
  # The open runs, their rows and files are the parent's: a forked child's
  # exit must not wait for the parent's writer thread, which it lacks, nor
  # close the parent's files. (No lock is taken: one a parent's thread held
  # at the fork stays held in the child for good.)
  OPEN.clear()
  writer_thread.shared.__init__()


add_barrier_hook(_flush_all)
atexit.register(_close_all_at_exit)
os.register_at_fork(after_in_child=_forget_runs_in_a_forked_child)
