"""What can still log to a run (``Users``): its ``Run`` object, its call
sites traced into programs, and its calls made outside ``jit`` not yet
delivered; a run nothing can log to any more is finished
(``open_runs.finish_abandoned``)."""

from __future__ import annotations

import threading
import weakref


class Users:
  """What can log to one sink (see ``RunSink.in_use``): weak references to
  its ``Run`` object and its call sites traced into programs (``add``), and
  how many calls made outside ``jit`` are not yet delivered
  (``eager_calls``: +1 a call made, -1 a call delivered). Holds no sink: a
  sink that replaced this one's keeps it."""

  lock = threading.Lock()  # one for all: a replaced sink's are shared

  def __init__(self, owner=None):
    self.refs: list[weakref.ref] = [] if owner is None else [
        weakref.ref(owner)]
    self.eager = 0
    self._pruned_at = 64

  def add(self, user) -> None:
    with self.lock:
      self.refs.append(weakref.ref(user))
      if len(self.refs) > self._pruned_at:  # a program traced many times
        self.refs[:] = [r for r in self.refs if r() is not None]
        self._pruned_at = max(64, 2 * len(self.refs))

  def eager_calls(self, count: int) -> None:
    with self.lock:
      self.eager = max(0, self.eager + count)

  def alive(self) -> bool:
    """(Called holding ``lock``.)"""
    self.refs[:] = [r for r in self.refs if r() is not None]
    return bool(self.refs) or self.eager > 0
