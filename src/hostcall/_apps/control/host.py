"""The host side of every steered loop of the process (``controls``): the
stop state each check reads (native, or Python where the library is
missing), Ctrl-C, predicates, and failures contained until every device
stopped."""

from __future__ import annotations

import itertools
import logging
import math
import os
import signal
import threading
import time
from typing import Any

from hostcall._apps import bars as _bars
from hostcall._apps.control.interrupts import (Reaper,
                                                frame_waiting_for_the_loop)
from hostcall._apps.control.spec import (FAILED, INTERRUPTED, MAX_LIMIT_US,
                                         STOP_WHEN, TIME_LIMIT, LoopStatus,
                                         Stop)
from hostcall._async import native
from hostcall._core import calls, errors

logger = logging.getLogger("hostcall")

# How long a check waits for the predicate before going on undecided.
_PREDICATE_WAIT = 60.0


class _PythonGroup:
  """An invocation's stop state, where the native library is missing (the
  same rules as ``hostcall_control.cc``)."""

  def __init__(self, stop: Stop, interrupts: int):
    # (A float: any limit adds to the clock without overflowing; math.inf
    # is none.)
    self.deadline = (None if stop.time_limit is None
                     or math.isinf(stop.time_limit)
                     else time.monotonic() + stop.time_limit)
    self.interruptible = stop.interruptible
    self.predicate = stop.stop_when is not None
    self.interrupts_at_open = interrupts
    self.requested = self.reason = 0
    self.stop_at = -1
    self.last_check = 0
    self.handles = 0


class _Failure:
  """A host function's failure contained in a steered loop's group, until
  the loop has stopped and its ``finish`` raises it."""

  __slots__ = ("exc", "raised", "devices")

  def __init__(self, exc: BaseException, device):
    self.exc, self.raised = exc, False
    self.devices = {device}  # where host calls are skipped until it stops


class _Controls(calls.Containment):
  """The host side of every steered loop of the process; also what
  contains a failure inside one (``calls.Containment``): its devices, and
  those of other processes, stop at the next check instead of one device
  leaving its peers waiting in a collective, and the loop's ``finish``
  raises it on each."""

  def __init__(self):
    self._lock = threading.Lock()
    self._changed = threading.Condition(self._lock)
    self._evaluated: dict[int, int] = {}    # handle -> ticks seen (Python)
    # (site, index) -> [group id, handles open]: an invocation's devices
    # share a group while any of them runs it (as the native state does,
    # which forgets a group with its last handle).
    self._groups: dict[tuple, list] = {}
    self._group_ids = itertools.count(1)
    self._open: dict[int, tuple] = {}       # handle -> (group, stop, opened)
    self._key_of: dict[int, tuple] = {}     # handle -> its (site, index)
    self._python: dict[int, _PythonGroup] = {}
    self._python_group_of: dict[int, int] = {}
    # Handles whose loop runs now -> whether Ctrl-C stops it (Python).
    self._running: dict[int, bool] = {}
    self._interrupts = 0                    # the Python handler's count
    self._first_taken = False
    self._previous_handler = None
    self._device_of: dict[int, Any] = {}    # open handle -> its device
    self._failures: dict[int, _Failure] = {}  # group -> contained failure
    self._reaper = Reaper(self.end)

  # -- opening and closing -------------------------------------------------

  def open(self, handle: int, stop: Stop, device=None) -> None:
    group_key = _bars.bars.group_of(handle)
    with self._lock:
      member = self._groups.get(group_key)
      if member is None:
        member = self._groups[group_key] = [next(self._group_ids), 0]
      member[1] += 1
      self._key_of[handle] = group_key
      group = member[0]
      self._device_of[handle] = device
      # A loop opened where a host function already failed (nested in the
      # failing loop's chunk) stops at its first check too.
      inherited = next((f for h, d in self._device_of.items()
                        if d == device and h != handle
                        for f in [self._failure_of(h)] if f is not None),
                       None)
      if inherited is not None:
        self._failures.setdefault(group, inherited)
    if stop.interruptible:
      frame = frame_waiting_for_the_loop()
      if frame is not None:
        self._reaper.watch(handle, frame)
      del frame
    lib = native.load()
    if lib is not None:
      # (Installs the SIGINT handler if this is the first interruptible
      # loop running.)
      limit = stop.time_limit
      lib.held.hostcall_control_open(
          handle, group,
          -1 if limit is None or limit * 1e6 >= MAX_LIMIT_US
          else int(limit * 1e6), int(stop.interruptible),
          int(stop.stop_when is not None))
    # Started after the native clock: a predicate never sees more time
    # elapsed than the check that compares it with the time limit.
    with self._lock:
      self._open[handle] = (group, stop, time.monotonic())
    if lib is None:
      self._open_python(handle, group, stop)
    if inherited is not None:  # once its stop state exists
      self.request(group, FAILED)

  def _open_python(self, handle: int, group: int, stop: Stop) -> None:
    """``open``'s stop state where the native library is missing."""
    if stop.interruptible:
      self.install_python_handler()
    with self._lock:
      state = self._python.get(group)
      if state is None:
        state = self._python[group] = _PythonGroup(stop, self._interrupts)
      if stop.interruptible and not self._interruptible_open():
        self._first_taken = False  # a new run of loops: the next Ctrl-C
      state.handles += 1
      self._python_group_of[handle] = group
      self._evaluated[handle] = 0
      self._running[handle] = stop.interruptible

  def end(self, handle: int) -> None:
    """``handle``'s loop no longer runs (its computation went past it, or
    failed): Ctrl-C is no longer its. The rest waits for its close."""
    self._reaper.forget(handle)
    lib = native.load()
    if lib is not None:
      lib.held.hostcall_control_end(handle)
      return
    with self._lock:
      if not self._running.pop(handle, False) or self._interruptible_open():
        return
    self._restore_python_handler()

  def close(self, handle: int) -> None:
    self.end(handle)
    with self._lock:
      if handle in self._key_of:
        group_key = self._key_of.pop(handle)
        member = self._groups[group_key]
        member[1] -= 1
        if not member[1]:
          del self._groups[group_key]
      found = self._open.pop(handle, None)
      self._device_of.pop(handle, None)
      if found is None:
        return
      group = found[0]
      if not any(g == group for g, _, _ in self._open.values()):
        failure = self._failures.pop(group, None)
        if failure is not None and not failure.raised:
          # Its computation failed elsewhere before the loop could raise
          # it: the barrier reports it, it is never lost.
          errors.postpone(failure.exc, "a host function in a steered loop")
      self._update_failing()
      self._evaluated.pop(handle, None)
      self._changed.notify_all()
      group = self._python_group_of.pop(handle, None)
      if group is not None:
        state = self._python[group]
        state.handles -= 1
        if not state.handles:
          del self._python[group]
    lib = native.load()
    if lib is not None:
      lib.held.hostcall_control_close(handle)

  # -- failures: contained, then raised once every device stopped ---------

  def _failure_of(self, handle: int) -> _Failure | None:
    found = self._open.get(handle)
    return None if found is None else self._failures.get(found[0])

  def _update_failing(self) -> None:
    self.failing = frozenset(
        d for h, d in self._device_of.items()
        for f in [self._failure_of(h)] if f is not None and d in f.devices)

  def take(self, context, exc: BaseException) -> bool:
    device = None if context is None else context.device
    with self._lock:
      groups = {self._open[h][0] for h, d in self._device_of.items()
                if d == device and h in self._open}
      if not groups:
        return False
      failure = _Failure(exc, device)
      for group in groups:
        self._failures.setdefault(group, failure).devices.add(device)
      self._update_failing()
    for group in groups:
      self.request(group, FAILED)
    return True

  def finish(self, handle: int, reason: int) -> None:
    """After a steered loop stopped on a device: raises the failure its
    group contained, if any (also for a loop that another process's failure
    stopped)."""
    self.end(handle)  # takes no more Ctrl-C
    with self._lock:
      failure = self._failure_of(handle)
      if failure is not None:
        failure.raised = True
      # This device has left the loop: a failure after it is not contained.
      self._device_of.pop(handle, None)
      self._update_failing()
    if failure is not None:
      raise failure.exc
    if reason == FAILED:
      raise RuntimeError(
          "hostcall: a host function failed in another process running this "
          "steered loop; every process stopped at the same check. Its error "
          "and traceback are in that process's log.")

  def _interruptible_open(self) -> bool:
    return any(self._running.values())

  # -- the host's decisions ------------------------------------------------

  def after_tick(self, handle: int, steps: int, device) -> None:
    """Runs the invocation's ``stop_when`` (from the delivery thread, after
    the chunk's tick and the rows it logged)."""
    with self._lock:
      found = self._open.get(handle)
    if found is None or found[1].stop_when is None:
      return
    group, stop, opened = found
    status = LoopStatus(steps, time.monotonic() - opened, device)
    try:
      decided = bool(stop.stop_when(status))
    except BaseException as exc:  # noqa: BLE001 - reported, and the loop stops
      errors.postpone(exc, f"stop_when {stop.stop_when!r}")
      decided = True
    if decided:
      self.request(group, STOP_WHEN)
    # Then the check waiting for this tick may answer.
    lib = native.load()
    if lib is not None:
      lib.held.hostcall_control_evaluated(handle)
      return
    with self._lock:
      if handle in self._evaluated:
        self._evaluated[handle] += 1
      self._changed.notify_all()

  def request(self, group: int, reason: int) -> None:
    lib = native.load()
    if lib is not None:
      lib.held.hostcall_control_request(group, reason)
      return
    with self._lock:
      state = self._python.get(group)
      # A failure outranks a reason asked for before it: every process
      # must learn of it (the checks' pmax carries the highest reason).
      if state is not None and (not state.requested or reason == FAILED):
        state.requested = reason
      self._changed.notify_all()

  def poll(self, handle: int, check: int) -> int:
    """The check, where the native library cannot serve it."""
    lib = native.load()
    if lib is not None:
      # Through the library that releases the GIL: the check may wait for
      # the delivery thread to run the predicate.
      return int(lib.hostcall_control_poll(handle, check))
    with self._lock:
      group = self._python_group_of.get(handle)
      state = self._python.get(group)
      if state is None:
        return 0
      if state.predicate and state.stop_at < 0:
        # (Condition.wait releases the lock, and the GIL while it waits.)
        # As the native check: wait until the predicate saw the last chunk.
        self._changed.wait_for(
            lambda: state.requested or self._evaluated.get(
                handle, check) >= check - 1, timeout=_PREDICATE_WAIT)
      if state.stop_at < 0:
        reason = state.requested
        if (not reason and state.interruptible
            and self._interrupts > state.interrupts_at_open):
          reason = INTERRUPTED
        if (not reason and state.deadline is not None
            and time.monotonic() >= state.deadline):
          reason = TIME_LIMIT
        if reason:
          state.reason, state.stop_at = reason, state.last_check + 1
      state.last_check = max(state.last_check, check)
      return state.reason if 0 <= state.stop_at <= check else 0

  # -- Ctrl-C without the native library -----------------------------------

  def install_python_handler(self) -> None:
    """Where the native library is missing: a Python SIGINT handler (which
    runs when the main thread next runs Python: while it waits for the
    loop, only in the loop's host calls, or after it). Installed when an
    interruptible loop is traced or opens in the main thread; put back
    when none runs, from the main thread (where the last loop ended
    elsewhere, or failed, at the next SIGINT, which it passes on)."""
    if native.load() is not None:
      return
    if threading.current_thread() is not threading.main_thread():
      return
    current = signal.getsignal(signal.SIGINT)
    # ==, not `is`: each access to a bound method makes a new object; a
    # handler installed over itself would call itself for every SIGINT.
    if current == self._on_sigint:
      return
    self._previous_handler = current
    signal.signal(signal.SIGINT, self._on_sigint)

  def _restore_python_handler(self) -> None:
    if threading.current_thread() is not threading.main_thread():
      return
    previous = self._previous_handler
    if (previous is not None
        and signal.getsignal(signal.SIGINT) == self._on_sigint):
      signal.signal(signal.SIGINT, previous)

  def _on_sigint(self, signo, frame):
    self._reaper.reap()  # loops whose computation failed take no Ctrl-C
    with self._lock:
      running = self._interruptible_open()
      take = running and not self._first_taken
      if take:
        self._first_taken = True
        self._interrupts += 1
    if take:
      return
    if not running:
      # None runs: put the handler back (from here, the main thread: the
      # loop ended or failed in another).
      self._restore_python_handler()
    previous = self._previous_handler
    if previous == signal.SIG_IGN:
      return
    if previous == signal.SIG_DFL:
      # What SIGINT does without a handler: end the process by it.
      signal.signal(signal.SIGINT, signal.SIG_DFL)
      os.kill(os.getpid(), signal.SIGINT)
      return
    if callable(previous):
      previous(signo, frame)
    else:  # installed outside Python: Python's own behaviour
      raise KeyboardInterrupt

  def interrupts(self) -> int:
    """SIGINTs taken for interruptible loops so far."""
    lib = native.load()
    if lib is not None:
      return int(lib.held.hostcall_control_interrupts())
    return self._interrupts

  def sigint_installed(self) -> bool:
    """Whether hostcall's SIGINT handler is installed now."""
    lib = native.load()
    if lib is not None:
      return bool(lib.held.hostcall_control_sigint_installed())
    return signal.getsignal(signal.SIGINT) == self._on_sigint


controls = _Controls()
_bars.bars.end_hooks.append(controls.close)
calls.set_containment(controls)
