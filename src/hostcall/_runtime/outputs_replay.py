"""Delivering deferred host calls once their program's outputs are ready.

``hostcall.jit`` runs a program whose host calls became outputs (see
``hostcall._jit.deferring``) and hands those outputs here with the
program's ``Plan``. One thread, ``hostcall-deferred``, takes every program
handed in since it last looked, fetches their values to the host together
(one trip for many calls: the thread's Python must not compete with the
caller's dispatch for the interpreter lock once per call) and replays their
host calls in the order the programs were called, each in program order.
A host function's failure is postponed to the next barrier, as an
asynchronous tap's is (``calls.run(..., asynchronous=True)``).

Values waiting here are bounded in bytes (the asynchronous queue's
capacity): a caller that runs ahead of the host functions waits for room,
as a producer of the queue does; the thread itself, or any host function
that calls a program, never waits.

Programs that queue their calls from the device instead (``hostcall.jit``
on CPU devices) have nothing here but ``keep_queueing`` and
``wait_for_queueing_programs``: they carry no effect JAX would wait for, so a
barrier
first waits for them to have run. On one device it waits for a program
dispatched after them (the device runs its programs in the order they
were dispatched); on several, where the CPU runtime does not keep that
order across devices (a program over several devices, as a settling
program would be, is scheduled apart from each device's own), for each
queueing program's last call itself: the order value it returned, an
output kept here until the barrier.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading

import jax
import numpy as np

from hostcall import _jax_private
from hostcall._runtime import calls, emission, errors
from hostcall._core.context import why_waiting_is_forbidden

logger = logging.getLogger("hostcall")


class Deferred:
  """The thread, and the programs' outputs waiting for it."""

  def __init__(self):
    self._cond = threading.Condition()
    self._pending: collections.deque = collections.deque()
    self._bytes = 0
    self._submitted = 0
    self._delivered = 0
    self._thread: threading.Thread | None = None
    self._waiters = 0  # callers waiting: deliver without gathering
    self.capacity = 64 << 20
    #: Seconds the thread gathers programs before fetching their values.
    self.gather = 0.002
    #: On several devices: the order values the last calls of the
    #: queueing programs dispatched since the last barrier returned (those
    #: known ready dropped once there are ``_bound``), and their lock.
    self._queueing: list = []
    self._bound = 64
    self._queueing_lock = threading.Lock()

  def after_fork_in_child(self) -> None:
    """A forked child has not the parent's thread: it forgets what the
    parent was to deliver."""
    self._cond = threading.Condition()
    self._pending = collections.deque()
    self._bytes = self._submitted = self._delivered = self._waiters = 0
    self._thread = None
    self._queueing, self._queueing_lock = [], threading.Lock()

  #: Whether a ``hostcall.jit`` program queued its calls from the device
  #: (``hostcall._jit.threaded``) since the last barrier.
  queued_since_barrier = False

  def keep_queueing(self, last) -> None:
    """Keeps ``last``, the order value a queueing program's last call
    returned (on several devices), until a barrier has waited for it: it
    is ready once the program's queued calls are all in the queue (the
    CPU runtime marks a program's outputs ready once all of it has run,
    its side-effecting custom calls included)."""
    with self._queueing_lock:
      kept = self._queueing
      kept.append(last)
      # (Marked here, once dispatched: a barrier another thread ran while
      # the program was dispatched took an earlier mark.)
      self.queued_since_barrier = True
      if len(kept) >= self._bound:
        kept = self._queueing = [a for a in kept if not a.is_ready()]
        # (A device far behind: what must wait grows, the checks do not.)
        self._bound = max(64, 2 * len(kept))

  def wait_for_queueing_programs(self) -> None:
    """Waits until the programs that queue their calls from the device,
    dispatched so far, have run (so that the queue holds their calls):
    they have no effect JAX would wait for. On several devices, for the
    order values they returned (``keep_queueing``); on one, the device
    runs programs in the order they were dispatched, so one dispatched now
    runs after them."""
    if not self.queued_since_barrier or not _jax_private.is_top_level():
      return  # (while tracing, a program run here would be staged)
    self.queued_since_barrier = False
    with self._queueing_lock:
      kept, self._queueing = self._queueing, []
      self._bound = 64
    if kept:
      for last in kept:
        try:
          last.block_until_ready()
        except Exception:  # noqa: BLE001 - its caller meets the failure
          # A failed program: its calls after the failure never ran, as
          # under jax.jit; the caller meets the error in its outputs.
          pass
      return
    # (No transfer guard to lift: the program takes no argument and its
    # output stays on the device. Entering one costs more than the program.)
    _settling_program()().block_until_ready()

  @property
  def is_deliverer(self) -> bool:
    return threading.current_thread() is self._thread

  def submit(self, plan, packs: list) -> None:
    """Hands in one program's packed outputs (device arrays, maybe not yet
    computed) to be replayed by ``plan``."""
    size = plan.nbytes
    with self._cond:
      if self._thread is None:
        self._start()
      if self._bytes and self._bytes + size > self.capacity:
        # A host function (on this thread, or on a runtime's thread for a
        # program this thread may be waiting for) never waits: the room it
        # would wait for may come only once it returns.
        if not self.is_deliverer and why_waiting_is_forbidden() is None:
          self._waiters += 1
          self._cond.notify_all()
          try:  # (Ctrl-C may end the wait: the thread gathers again)
            self._cond.wait_for(lambda: not self._bytes
                                or self._bytes + size <= self.capacity)
          finally:
            self._waiters -= 1
      if not self._pending:  # the thread sleeps until something comes
        self._cond.notify_all()
      self._pending.append((plan, packs, size))
      self._bytes += size
      self._submitted += 1

  @property
  def started(self) -> bool:
    """Whether the thread was started (a program's calls handed in)."""
    return self._thread is not None

  def _start(self) -> None:
    thread = threading.Thread(target=self._run, daemon=True,
                              name="hostcall-deferred")
    # Python 3.12 on starts no thread once the interpreter exits (an exit
    # handler's first call): then nothing is marked started.
    thread.start()
    self._thread = thread

  def start(self) -> bool:
    """Starts the thread if it is not; whether it runs (False where no
    thread can start: the interpreter is exiting)."""
    with self._cond:
      if self._thread is None:
        try:
          self._start()
        except RuntimeError:
          return False
      return True

  def _run(self) -> None:
    while True:
      with self._cond:
        self._cond.wait_for(lambda: self._pending)
        # Gather what comes in the next window (unless someone waits):
        # one trip for many calls, and the caller's dispatch keeps the
        # interpreter lock meanwhile.
        self._cond.wait_for(lambda: self._waiters, self.gather)
        batch = list(self._pending)
        self._pending.clear()
      try:
        fetched = _fetch([packs for _, packs, _ in batch])
      except BaseException as exc:  # noqa: BLE001 - the thread never dies
        fetched = [exc] * len(batch)
      for group in _groups(batch, fetched):
        try:
          plan, packs, _, values = group[0]
          if values is None:
            continue  # a failed program (see _groups)
          plan.replay([values[0] for *_, values in group],
                      _jax_private.device_assignment(packs[0].sharding),
                      _run_one)
        except BaseException as exc:  # noqa: BLE001 - the thread never dies
          errors.postpone(exc, "delivering the host calls of a hostcall.jit "
                          "program")
        finally:
          with self._cond:
            self._bytes -= sum(size for _, _, size, _ in group)
            self._delivered += len(group)
            self._cond.notify_all()
      batch = fetched = packs = None
      calls.round_ended()

  def pending(self) -> int:
    with self._cond:
      return self._submitted - self._delivered

  def submitted(self) -> int:
    return self._submitted

  def drain(self, count: int | None = None) -> None:
    """Waits until every program handed in so far (or the first ``count``)
    has had its host calls delivered; returns at once on the thread."""
    if self._thread is None or self.is_deliverer:
      return
    with self._cond:
      count = self._submitted if count is None else count
      self._waiters += 1  # no gathering while someone waits
      self._cond.notify_all()
      try:
        self._cond.wait_for(lambda: self._delivered >= count)
      finally:
        self._waiters -= 1


def _groups(batch: list, fetched: list) -> list:
  """The batch's programs, ``(plan, packs, size, values)``, in runs of
  consecutive calls of the same program on the same devices (replayed
  together: one trace may run on several devices, each call's host calls
  are told their own). A failed
  program is left out (its caller meets the error in its results; its host
  calls never ran, as under jax.jit), counted as delivered."""
  groups: list = []
  for (plan, packs, size), values in zip(batch, fetched):
    if isinstance(values, BaseException):
      logger.debug("hostcall.jit: a program failed (%s); its host calls "
                   "are not delivered", errors.safe_str(values))
      groups.append([(plan, packs, size, None)])
      continue
    if (groups and groups[-1][0][0] is plan and groups[-1][0][3] is not None
        and _same_devices(groups[-1][0][1][0].sharding, packs[0].sharding)):
      groups[-1].append((plan, packs, size, values))
    else:
      groups.append([(plan, packs, size, values)])
  return groups


def _same_devices(one, other) -> bool:
  return one is other or one == other


def _fetch(batches: list) -> list:
  """Every program's packs as NumPy arrays (a failed program's: its error,
  for its calls only). Off the CPU, every copy starts before the first is
  awaited."""
  # The runtime hands a callback its operands whatever the caller's
  # transfer guard says; so does this thread.
  with jax.transfer_guard_device_to_host("allow"):
    if not _host_buffers():
      for packs in batches:
        try:
          for p in packs:
            p.copy_to_host_async()
        except Exception:  # noqa: BLE001 - its program failed: met below
          pass
    out = []
    for packs in batches:
      try:
        out.append([np.asarray(p) for p in packs])
      except BaseException as exc:  # noqa: BLE001 - its program failed
        out.append(exc)
  return out


@functools.cache
def _host_buffers() -> bool:
  """Whether the default devices' buffers are host memory (a fetch is then
  a view: nothing to start ahead); the platform's row says."""
  return emission.platform(jax.default_backend()).host_buffers


@functools.cache
def _settling_program():
  """A program on the default device, which runs after the programs
  dispatched to it before (one device)."""
  return jax.jit(lambda: jax.numpy.zeros((), np.uint8))


def _run_one(target, operands, context) -> None:
  calls.run(target, operands, context, asynchronous=True)


deferred = Deferred()
os.register_at_fork(after_in_child=deferred.after_fork_in_child)
