"""The host side of every steered loop of the process (``controls``): the
invocations' groups and their handles, the predicates, and failures
contained until every device stopped, over one ``StopStates`` (native, or
Python where the library is missing; ``states.py``), chosen at first use."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from hostcall._apps import bars as _bars
from hostcall._apps.control import states as _states
from hostcall._apps.control.interrupts import (Reaper,
                                                frame_waiting_for_the_loop)
from hostcall._apps.control.spec import FAILED, STOP_WHEN, LoopStatus, Stop
from hostcall._async import queue
from hostcall._core import calls, errors


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
  raises it on each.

  Arguments:
    stop_states: the ``StopStates`` the checks read; by default chosen at
      first use (``states.choose``: native where the library loads).
  """

  def __init__(self, stop_states: _states.StopStates | None = None):
    self._lock = threading.Lock()
    self._stop_states = stop_states
    # (site, index) -> [group id, handles open]: an invocation's devices
    # share a group while any of them runs it (as the stop states do,
    # which forget a group with its last handle).
    self._groups: dict[tuple, list] = {}
    self._group_ids = itertools.count(1)
    self._open: dict[int, tuple] = {}       # handle -> (group, stop, opened)
    self._key_of: dict[int, tuple] = {}     # handle -> its (site, index)
    self._device_of: dict[int, Any] = {}    # open handle -> its device
    self._failures: dict[int, _Failure] = {}  # group -> contained failure
    self._reaper = Reaper(self.end)

  @property
  def states(self) -> _states.StopStates:
    """The stop states, chosen once (at first use)."""
    if self._stop_states is None:
      with self._lock:
        if self._stop_states is None:
          self._stop_states = _states.choose(self._reaper.reap)
    return self._stop_states

  @property
  def native(self) -> bool:
    """Whether the checks are answered by the native library (which the
    compiled check calls without Python)."""
    return self.states.native

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
    if stop.stop_when is not None:
      # Its checks wait for the predicate to see each tick: the consumer
      # delivers ticks as they come (no gathering) while it is open.
      queue.consumer.start().hurry(1)
    self.states.open(handle, group, stop)
    # Started after the stop state's clock: a predicate never sees more
    # time elapsed than the check that compares it with the time limit.
    with self._lock:
      self._open[handle] = (group, stop, time.monotonic())
    if inherited is not None:  # once its stop state exists
      self.request(group, FAILED)

  def end(self, handle: int) -> None:
    """``handle``'s loop no longer runs (its computation went past it, or
    failed): Ctrl-C is no longer its. The rest waits for its close."""
    self._reaper.forget(handle)
    self.states.end(handle)

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
      group, stop, _ = found
      if not any(g == group for g, _, _ in self._open.values()):
        failure = self._failures.pop(group, None)
        if failure is not None and not failure.raised:
          # Its computation failed elsewhere before the loop could raise
          # it: the barrier reports it, it is never lost.
          errors.postpone(failure.exc, "a host function in a steered loop")
      self._update_failing()
    self.states.close(handle)
    if stop.stop_when is not None:
      queue.consumer.start().hurry(-1)

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
    self.states.evaluated(handle)

  def request(self, group: int, reason: int) -> None:
    self.states.request(group, reason)

  def poll(self, handle: int, check: int) -> int:
    """The check, where it is a Python callback."""
    return self.states.poll(handle, check)

  def prepare_interruptible(self) -> None:
    """An interruptible loop is traced: be ready for Ctrl-C (the Python
    stop states install their handler now, in the main thread)."""
    self.states.prepare_interruptible()

  def interrupts(self) -> int:
    """SIGINTs taken for interruptible loops so far."""
    return self.states.interrupts()

  def sigint_installed(self) -> bool:
    """Whether hostcall's SIGINT handler is installed now."""
    return self.states.sigint_installed()


controls = _Controls()
_bars.bars.end_hooks.append(controls.close)
calls.set_containment(controls)
