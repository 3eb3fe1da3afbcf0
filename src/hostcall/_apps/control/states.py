"""Each invocation's stop state, what a steered loop's check reads: one
interface (``StopStates``) with two implementations, chosen once per
process (``choose``): ``NativeStopStates`` (``hostcall_control.cc``, which
the compiled check calls without Python) and ``PythonStopStates`` (the same
rules in Python, where the library is missing: the check is a Python
callback, Ctrl-C a Python handler)."""

from __future__ import annotations

import abc
import math
import os
import signal
import threading
import time
from typing import Callable

from hostcall._apps.control import native
from hostcall._apps.control.spec import (FAILED, INTERRUPTED, MAX_LIMIT_US,
                                         TIME_LIMIT, Stop)

# How long a check waits for the predicate before going on undecided.
PREDICATE_WAIT = 60.0


class StopStates(abc.ABC):
  """The stop states of every open handle (one device's run of one
  invocation), grouped by invocation: what decides, at each check, whether
  a loop stops (a predicate's request, Ctrl-C, the time limit), so that
  every device of an invocation stops after the same check.

  Example:
    >>> from hostcall._apps.control.states import PythonStopStates
    >>> from hostcall._apps.control.spec import Stop, STOP_WHEN
    >>> states = PythonStopStates()
    >>> states.open(7, group=1, stop=Stop.of(False, 3600.0, None))
    >>> states.poll(7, 1)   # no reason to stop: go on
    0
    >>> states.request(1, STOP_WHEN)
    >>> states.poll(7, 2) == STOP_WHEN   # stops at the next check
    True
    >>> states.close(7)
  """

  #: Whether the compiled check can call this implementation without
  #: Python (``emission.route``'s "native library" column).
  native: bool = False

  @abc.abstractmethod
  def open(self, handle: int, group: int, stop: Stop) -> None:
    """Opens ``handle`` in ``group`` (an invocation; its first handle fixes
    the group's time limit, from now); an interruptible loop takes Ctrl-C
    from here until ``end``."""

  @abc.abstractmethod
  def end(self, handle: int) -> None:
    """``handle``'s loop no longer runs: it takes no more Ctrl-C (the
    handler it replaced is put back once none runs)."""

  @abc.abstractmethod
  def close(self, handle: int) -> None:
    """Forgets ``handle`` (and its group with its last handle)."""

  @abc.abstractmethod
  def hold(self, group: int) -> None:
    """Keeps ``group`` (opened by a handle) after its last handle closes,
    until ``release``: a device of the invocation that opens after its
    peers closed joins it, and stops after the same check."""

  @abc.abstractmethod
  def release(self, group: int) -> None:
    """Every device of ``group``'s invocation has closed (or never will):
    it is forgotten with its last handle."""

  @abc.abstractmethod
  def request(self, group: int, reason: int) -> None:
    """Asks ``group`` to stop for ``reason`` (a predicate said so, or a
    contained failure: which outranks a reason asked before it)."""

  @abc.abstractmethod
  def evaluated(self, handle: int) -> None:
    """The predicate has seen one more tick of ``handle``."""

  @abc.abstractmethod
  def poll(self, handle: int, check: int) -> int:
    """The check: 0 to go on, else the reason to stop. A loop with a
    predicate waits (up to ``PREDICATE_WAIT``) until the predicate has
    seen the chunk before."""

  @abc.abstractmethod
  def interrupts(self) -> int:
    """SIGINTs taken for interruptible loops so far."""

  @abc.abstractmethod
  def sigint_installed(self) -> bool:
    """Whether hostcall's SIGINT handler is installed now."""

  def prepare_interruptible(self) -> None:
    """An interruptible loop is traced: be ready to take Ctrl-C (the native
    handler is installed at the loop's open, from any thread)."""


class NativeStopStates(StopStates):
  """The stop states in ``hostcall_control.cc``; ``lib`` is the loaded
  library (``native.load()``)."""

  native = True

  def __init__(self, lib):
    self._lib = lib

  def open(self, handle, group, stop):
    # (Installs the SIGINT handler if this is the first interruptible
    # loop running.)
    limit = stop.time_limit
    self._lib.held.hostcall_control_open(
        handle, group,
        -1 if limit is None or limit * 1e6 >= MAX_LIMIT_US
        else int(limit * 1e6), int(stop.interruptible),
        int(stop.stop_when is not None))

  def end(self, handle):
    self._lib.held.hostcall_control_end(handle)

  def close(self, handle):
    self._lib.held.hostcall_control_close(handle)

  def hold(self, group):
    self._lib.held.hostcall_control_hold(group)

  def release(self, group):
    self._lib.held.hostcall_control_release(group)

  def request(self, group, reason):
    self._lib.held.hostcall_control_request(group, reason)

  def evaluated(self, handle):
    self._lib.held.hostcall_control_evaluated(handle)

  def poll(self, handle, check):
    # Through the library that releases the GIL: the check may wait for
    # the delivery thread to run the predicate.
    return int(self._lib.hostcall_control_poll(handle, check))

  def interrupts(self):
    return int(self._lib.held.hostcall_control_interrupts())

  def sigint_installed(self):
    return bool(self._lib.held.hostcall_control_sigint_installed())


class _Group:
  """An invocation's stop state (the rules of ``hostcall_control.cc``)."""

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
    self.held = False


class PythonStopStates(StopStates):
  """The stop states in Python, with a Python SIGINT handler (which runs
  when the main thread next runs Python: while it waits for the loop, only
  in the loop's host calls, or after it). ``before_sigint`` runs first at
  each SIGINT (the loops whose computation failed are ended)."""

  def __init__(self, before_sigint: Callable[[], None] = lambda: None):
    self._before_sigint = before_sigint
    self._lock = threading.Lock()
    self._changed = threading.Condition(self._lock)
    self._groups: dict[int, _Group] = {}
    self._group_of: dict[int, int] = {}     # handle -> group
    self._evaluated: dict[int, int] = {}    # handle -> ticks seen
    # Handles whose loop runs now -> whether Ctrl-C stops it.
    self._running: dict[int, bool] = {}
    self._interrupts = 0
    self._first_taken = False
    self.previous_handler = None

  def open(self, handle, group, stop):
    if stop.interruptible:
      self.prepare_interruptible()
    with self._lock:
      state = self._groups.get(group)
      if state is None:
        state = self._groups[group] = _Group(stop, self._interrupts)
      if stop.interruptible and not self._interruptible_open():
        self._first_taken = False  # a new run of loops: the next Ctrl-C
      state.handles += 1
      self._group_of[handle] = group
      self._evaluated[handle] = 0
      self._running[handle] = stop.interruptible

  def _interruptible_open(self) -> bool:
    return any(self._running.values())

  def end(self, handle):
    with self._lock:
      if not self._running.pop(handle, False) or self._interruptible_open():
        return
    self._restore_handler()

  def close(self, handle):
    self.end(handle)
    with self._lock:
      self._evaluated.pop(handle, None)
      self._changed.notify_all()
      group = self._group_of.pop(handle, None)
      if group is not None:
        state = self._groups[group]
        state.handles -= 1
        if not state.handles and not state.held:
          del self._groups[group]

  def hold(self, group):
    with self._lock:
      state = self._groups.get(group)
      if state is not None:
        state.held = True

  def release(self, group):
    with self._lock:
      state = self._groups.get(group)
      if state is not None:
        state.held = False
        if not state.handles:
          del self._groups[group]

  def request(self, group, reason):
    with self._lock:
      state = self._groups.get(group)
      # A failure outranks a reason asked for before it: every process
      # must learn of it (the checks' pmax carries the highest reason).
      if state is not None and (not state.requested or reason == FAILED):
        state.requested = reason
      self._changed.notify_all()

  def evaluated(self, handle):
    with self._lock:
      if handle in self._evaluated:
        self._evaluated[handle] += 1
      self._changed.notify_all()

  def poll(self, handle, check):
    with self._lock:
      state = self._groups.get(self._group_of.get(handle))
      if state is None:
        return 0
      if state.predicate and state.stop_at < 0:
        # (Condition.wait releases the lock, and the GIL while it waits.)
        # As the native check: wait until the predicate saw the last chunk.
        self._changed.wait_for(
            lambda: state.requested or self._evaluated.get(
                handle, check) >= check - 1, timeout=PREDICATE_WAIT)
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

  def interrupts(self):
    return self._interrupts

  def sigint_installed(self):
    return signal.getsignal(signal.SIGINT) == self.on_sigint

  # -- Ctrl-C -----------------------------------------------------------

  def prepare_interruptible(self):
    """Installs the Python SIGINT handler, when an interruptible loop is
    traced or opens in the main thread; put back when none runs, from the
    main thread (where the last loop ended elsewhere, or failed, at the
    next SIGINT, which it passes on)."""
    if threading.current_thread() is not threading.main_thread():
      return
    current = signal.getsignal(signal.SIGINT)
    # ==, not `is`: each access to a bound method makes a new object; a
    # handler installed over itself would call itself for every SIGINT.
    if current == self.on_sigint:
      return
    self.previous_handler = current
    signal.signal(signal.SIGINT, self.on_sigint)

  def _restore_handler(self) -> None:
    if threading.current_thread() is not threading.main_thread():
      return
    previous = self.previous_handler
    if (previous is not None
        and signal.getsignal(signal.SIGINT) == self.on_sigint):
      signal.signal(signal.SIGINT, previous)

  def on_sigint(self, signo, frame) -> None:
    """The handler: the first SIGINT while an interruptible loop runs stops
    the loops; any other goes to the handler it replaced."""
    self._before_sigint()
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
      self._restore_handler()
    previous = self.previous_handler
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


def choose(before_sigint: Callable[[], None]) -> StopStates:
  """The native stop states where the library loads (``native.load()``;
  ``HOSTCALL_NATIVE=0`` refuses it), else the Python ones.

  Arguments:
    before_sigint: what the Python handler runs first at each SIGINT.

  Returns:
    The process's ``StopStates``.

  Example:
    >>> from hostcall._apps.control import states
    >>> isinstance(states.choose(lambda: None), states.StopStates)
    True
  """
  lib = native.load()
  if lib is not None:
    return NativeStopStates(lib)
  return PythonStopStates(before_sigint)
