"""The host side of every steered loop of the process (``controls``): the
invocations' groups and their handles, the predicates, and failures
contained until every device stopped, over the process's ``StopStates``
(``states.py``), loaded at first use."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from typing import Any

from hostcall._apps.loops import invocations as _loops
from hostcall._apps.control import states as _states
from hostcall._apps.control.interrupts import Reaper
from hostcall._apps.control.spec import FAILED, STOP_WHEN, LoopStatus, Stop
from hostcall._runtime import calls, errors, tap_queue
from hostcall._runtime.barriers import add_barrier_hook, barrier_started


class _Failure:
  """A host function's failure contained in a steered loop's group, until
  the loop has stopped and its ``finish`` raises it."""

  __slots__ = ("exc", "raised", "devices")

  def __init__(self, exc: BaseException, device):
    self.exc, self.raised = exc, False
    self.devices = {device}  # where host calls are skipped until it stops


_ORPHAN = object()  # the key of a group the loops' registry does not know


class _Group:
  """One invocation of a steered loop on this process's devices: from its
  first device's open until every device of it has ended (the loops'
  ``on_release``), so that a device that opens after its peers closed
  joins their stop decision and their contained failure."""

  __slots__ = ("id", "key", "handles", "failure", "opened")

  def __init__(self, group_id: int, key: tuple):
    self.id, self.key = group_id, key
    self.handles: set[int] = set()  # every handle that opened it
    self.failure: _Failure | None = None
    self.opened = time.monotonic()


class _Controls(calls.Containment, _loops.Listener):
  """The host side of every steered loop of the process; also what
  contains a failure inside one (``calls.Containment``): its devices, and
  those of other processes, stop at the next check instead of one device
  leaving its peers waiting in a collective, and the loop's ``finish``
  raises it on each.

  Arguments:
    stop_states: the ``StopStates`` the checks read; by default chosen at
      first use (``states.choose``).
  """

  #: Failures of released invocations kept for finishes still to come (a
  #: global view's devices finish after its one device closed the loop),
  #: the oldest reported beyond this many.
  KEPT_FAILURES = 1024

  def __init__(self, stop_states: _states.StopStates | None = None):
    self._lock = threading.Lock()
    self._stop_states = stop_states
    # An invocation's (site, index) -> its group, until it is released.
    self._groups: dict[tuple, _Group] = {}
    self._group_ids = itertools.count(1)
    self._open: dict[int, tuple] = {}       # handle -> (group, stop, opened)
    self._group_of: dict[int, _Group] = {}  # handle -> its group, until released
    self._device_of: dict[int, Any] = {}    # open handle -> its device
    # open handle -> the thread that opened it, the one its computation
    # runs on (a failure on another thread is another computation's).
    self._thread_of: dict[int, int] = {}
    # Released groups' failures not yet raised, by handle: a finish still
    # to come raises it; the next barrier reports what none raised.
    self._released_failures: collections.OrderedDict = (
        collections.OrderedDict())
    self._reaper = Reaper(self.end)

  @property
  def states(self) -> _states.StopStates:
    """The stop states, chosen once (at first use)."""
    if self._stop_states is None:
      with self._lock:
        if self._stop_states is None:
          self._stop_states = _states.choose()
    return self._stop_states

  @property
  def native(self) -> bool:
    """Whether the compiled check calls the stop states without Python
    (their FFI handler is registered)."""
    return self.states.native

  # -- opening and closing -------------------------------------------------

  def open(self, handle: int, stop: Stop, device=None,
           waiter=None) -> None:
    """``waiter``: the frame waiting for the loop's computation
    (``Invocation.waiter``), which the reaper watches where the loop is
    interruptible."""
    # (A handle ended before this open, by progress.close_all
    # in another thread, runs in a group of its own, released at its close.)
    group_key = _loops.invocations.group_of(handle) or (_ORPHAN, handle)
    if stop.interruptible and waiter is not None:
      self._reaper.watch(handle, waiter)
    if stop.stop_when is not None:
      # Its checks wait for the predicate to see each tick: the consumer
      # delivers ticks as they come (no gathering) while it is open.
      tap_queue.consumer.start().add_waiters(1)
    states = self.states
    with self._lock:
      group = self._groups.get(group_key)
      if group is None:
        group = self._groups[group_key] = _Group(next(self._group_ids),
                                                 group_key)
      states.open(handle, group.id, stop)
      if not group.handles:  # its first: held until every device has ended
        states.hold(group.id)
      group.handles.add(handle)
      self._group_of[handle] = group
      self._device_of[handle] = device
      self._thread_of[handle] = threading.get_ident()
      # A loop opened where a host function already failed (nested in the
      # failing loop's chunk) stops at its first check too.
      inherited = next((f for h, d in self._device_of.items()
                        if d == device and h != handle
                        for f in [self._failure_of(h)] if f is not None),
                       None)
      if inherited is not None and group.failure is None:
        group.failure = inherited
      # Started after the stop state's clock: a predicate never sees more
      # time elapsed than the check that compares it with the time limit.
      self._open[handle] = (group.id, stop, time.monotonic())
    if inherited is not None:
      self.request(group.id, FAILED)

  def end(self, handle: int) -> None:
    """``handle``'s loop no longer runs (its computation went past it, or
    failed): Ctrl-C is no longer its. The rest waits for its close."""
    self._reaper.forget(handle)
    self.states.end(handle)

  def close(self, handle: int) -> None:
    """``handle``'s device has left the loop; its group stays until the
    invocation is released (``release``)."""
    self.end(handle)
    with self._lock:
      found = self._open.pop(handle, None)
      self._device_of.pop(handle, None)
      self._thread_of.pop(handle, None)
      if found is None:
        return
      self.states.close(handle)
      self._update_failing()
      group = self._group_of.get(handle)
    if found[1].stop_when is not None:
      tap_queue.consumer.start().add_waiters(-1)
    if group is not None and group.key[0] is _ORPHAN:
      self.release(group.key)

  def release(self, group_key: tuple) -> None:
    """Every device of the invocation ``group_key`` has ended (its
    ``on_release``): its group and stop state are forgotten. A failure it
    contained stays for the finishes still to come (a global view's
    devices finish after its one device closed the loop) until the next
    barrier, which reports it if none raised it."""
    evicted = []
    with self._lock:
      group = self._groups.pop(group_key, None)
      if group is None:
        return
      for handle in group.handles:
        self._group_of.pop(handle, None)
      self.states.release(group.id)
      failure = group.failure
      if failure is not None:  # raised on one device, maybe not on all
        for handle in group.handles:
          self._released_failures[handle] = (failure, group.opened)
        while len(self._released_failures) > self.KEPT_FAILURES:
          evicted.append(self._released_failures.popitem(last=False)[1][0])
    for failure in evicted:
      self._report(failure)

  def after_barrier(self) -> None:
    """Every computation started before the barrier has ended: a failure
    of a loop opened before it (whose finishes have all run) that no finish
    raised (its computation failed elsewhere first) is reported by the
    barrier; it is never lost."""
    started = barrier_started()
    with self._lock:
      reported = [(handle, failure) for handle, (failure, opened)
                  in self._released_failures.items()
                  if started is None or opened < started]
      for handle, _ in reported:
        del self._released_failures[handle]
    for _, failure in reported:
      self._report(failure)

  @staticmethod
  def _report(failure: _Failure) -> None:
    if not failure.raised:
      failure.raised = True
      errors.postpone(failure.exc, "a host function in a steered loop")

  # -- as a listener of the loops' invocations: what it hears of them ------

  def on_opened(self, invocation) -> None:
    if invocation.stop is not None:  # a steered loop
      self.open(invocation.handle, invocation.stop, invocation.device,
                invocation.waiter)

  def follows_every_tick(self, spec, handle) -> bool:
    del spec
    return self.watches(handle)

  def on_ticked(self, handle, count, device) -> None:
    self.after_tick(handle, count, device)

  def on_finish(self, handle, reason) -> None:
    self.finish(handle, reason)

  def on_end(self, invocation, count, lanes, stopped, force) -> None:
    del count, lanes, stopped, force
    if invocation.stop is not None:  # only a steered loop was opened here
      self.close(invocation.handle)

  def on_release(self, group) -> None:
    self.release(group)

  # -- failures: contained, then raised once every device stopped ---------

  def _failure_of(self, handle: int) -> _Failure | None:
    group = self._group_of.get(handle)
    if group is not None:
      return group.failure
    released = self._released_failures.get(handle)
    return None if released is None else released[0]

  def _update_failing(self) -> None:
    self.failing = frozenset(
        d for h, d in self._device_of.items()
        for f in [self._failure_of(h)] if f is not None and d in f.devices)

  def take(self, context, exc: BaseException) -> bool:
    device = None if context is None else context.device
    thread = threading.get_ident()
    with self._lock:
      # Each loop of the device that still runs stops for the failure, if
      # the failing computation is the loop's: one that another thread
      # runs on the same device (a CPU device runs several at once) fails
      # as it would outside any loop. (A loop whose device ended it,
      # hostcall.jit's own finish, with its close still to come, holds
      # none: the stop states decide that and the request in one step,
      # against that finish.)
      groups = {self._group_of[h] for h, d in self._device_of.items()
                if d == device and self._thread_of.get(h) == thread
                and h in self._open and h in self._group_of
                and self.states.contain(h, self._group_of[h].id)}
      if not groups:
        return False
      failure = _Failure(exc, device)
      for group in groups:
        if group.failure is None:
          group.failure = failure
        group.failure.devices.add(device)
      self._update_failing()
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
      self._thread_of.pop(handle, None)
      self._update_failing()
    if failure is not None:
      raise failure.exc
    if reason == FAILED:
      raise RuntimeError(
          "hostcall: a host function failed in another process running this "
          "steered loop; every process stopped at the same check. Its error "
          "and traceback are in that process's log.")

  # -- the host's decisions ------------------------------------------------

  def watches(self, handle: int) -> bool:
    """Whether ``after_tick`` runs a predicate for ``handle``'s ticks."""
    with self._lock:
      found = self._open.get(handle)
    return found is not None and found[1].stop_when is not None

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

  def interrupts(self) -> int:
    """SIGINTs taken for interruptible loops so far."""
    return self.states.interrupts()

  def sigint_installed(self) -> bool:
    """Whether hostcall's SIGINT handler is installed now."""
    return self.states.sigint_installed()


controls = _Controls()
_loops.invocations.listen(controls)
add_barrier_hook(controls.after_barrier)
calls.set_containment(controls)
