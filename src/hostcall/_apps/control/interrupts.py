"""When an interruptible loop stops taking Ctrl-C after its computation
failed: the frame that called the computation is watched (``Reaper``)."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Callable

from hostcall._runtime.waiting_frames import on_stack

logger = logging.getLogger("hostcall")

# Seconds between two looks at the frames that run interruptible loops.
_REAP_INTERVAL = 0.02


class Reaper:
  """Ends the interruptible loops whose computation has ended without
  saying so (it failed before the loop's last check): a loop opened by a
  computation that runs in a Python thread lives while the frame that
  called the computation is on that thread's stack."""

  def __init__(self, end: Callable[[int], None]):
    self._end = end
    self._lock = threading.Lock()
    self._watching = threading.Condition(self._lock)
    self._watched: dict[int, tuple[int, Any]] = {}  # handle -> (thread, frame)
    self._thread: threading.Thread | None = None

  def watch(self, handle: int, frame) -> None:
    with self._lock:
      self._watched[handle] = (threading.get_ident(), frame)
      if self._thread is None or not self._thread.is_alive():
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="hostcall-loop-reaper")
        self._thread.start()
      self._watching.notify_all()

  def forget(self, handle: int) -> None:
    with self._lock:
      self._watched.pop(handle, None)  # (holds the frame, and its locals)

  def reap(self) -> None:
    """Ends, now, the watched loops whose computation has ended."""
    with self._lock:
      watched = list(self._watched.items())
    if not watched:
      return
    stacks = sys._current_frames()
    try:
      ended = [handle for handle, (thread, frame) in watched
               if not on_stack(stacks.get(thread), frame)]
    finally:
      del stacks  # frames of every thread: let them go now
    for handle in ended:
      self.forget(handle)
      self._end(handle)

  def _loop(self) -> None:
    while True:
      with self._lock:
        self._watching.wait_for(lambda: self._watched)
        # Polls, at most every _REAP_INTERVAL, only while loops run: no
        # event tells when a computation fails outside hostcall.
        self._watching.wait(_REAP_INTERVAL)
      try:
        self.reap()
      except BaseException:  # noqa: BLE001 - the reaper never dies
        logger.exception("hostcall: watching interruptible loops failed")
