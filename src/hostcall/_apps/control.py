"""Steering compiled loops from the host: stop at the next check, keep the
state so far.

A steered loop (``hostcall.progress.scan`` / ``fori_loop`` / ``while_loop``
with ``interruptible=``, ``time_limit=`` or ``stop_when=``, or
``hostcall.control.while_loop``) runs in chunks of steps, as the progress
loops do, and after each chunk asks "stop now?" (``check``). The answer
comes from host state in about a microsecond (the native library's
``hostcall_control_check``; a Python callback where it cannot serve), so
the device waits for no Python: the host sets that state when Ctrl-C
arrives, when the time limit passes (checked against the clock), or when a
predicate run after each chunk's tick says so. The loop then skips what is
left and returns its state with how many steps it ran and why it stopped.

Every device running one invocation stops after the same check (see
``hostcall_control.cc``); under ``vmap`` every lane stops with the others.

Ctrl-C: hostcall's SIGINT handler is installed while an interruptible loop
runs, and the one it replaced is put back as soon as none does. A loop stops
running when its computation goes past it (the loop's finish, a
synchronous call each device makes after the loop: not its bar's close,
which waits behind the loop's asynchronous taps) or fails: where the computation runs in a Python thread
(JAX runs one with host callbacks in the thread that called it, on CPU),
the frame that called it is watched, and its return ends the loops the
computation opened (``_Reaper``); elsewhere a failed loop ends at the next
barrier, which closes its bar.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import numbers
import os
import signal
import sys
import threading
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from hostcall import _jax_private
from hostcall._apps import bars as _bars
from hostcall._async import native
from hostcall._core import calls, emission, errors
from hostcall._core.primitive import is_eager_call
from hostcall._core.targets import hash_key

logger = logging.getLogger("hostcall")

# Why a loop stopped early (``Result.reason``); 0: it ran to its end.
#: ``Result.reason`` of a loop stopped by Ctrl-C (``interruptible=True``).
INTERRUPTED = 1
#: ``Result.reason`` of a loop stopped by its ``time_limit=``.
TIME_LIMIT = 2
#: ``Result.reason`` of a loop stopped by its ``stop_when=`` predicate.
STOP_WHEN = 3
#: ``Result.reason`` of a loop stopped because a host function it ran failed
#: (on this device or another): never returned, the loop's call raises that
#: failure on every device once they have all stopped.
FAILED = 4
# How long a check waits for the predicate before going on undecided.
_PREDICATE_WAIT = 60.0
#: The index of the check a loop makes once it has ended (``end``).
# Seconds between two looks at the frames that run interruptible loops.
_REAP_INTERVAL = 0.02

_REASON_NAMES = {0: None, INTERRUPTED: "interrupted", TIME_LIMIT: "time_limit",
                 STOP_WHEN: "stop_when", FAILED: "failed"}


def reason_name(reason) -> str | None:
  """``"interrupted"``, ``"time_limit"``, ``"stop_when"``, or None (the loop
  ran to its end) for a ``Result.reason``."""
  accepted = ", ".join(f"{k} ({v or 'ran to its end'})"
                       for k, v in _REASON_NAMES.items())
  if isinstance(reason, _jax_private.Tracer):
    raise TypeError(
        f"reason_name reads a Result.reason on the host, got a traced value "
        f"({reason!r}); call it on the Result the jitted function returns "
        "(or compare the reason with hostcall.control.TIME_LIMIT and the "
        "others inside it).")
  try:
    values = np.asarray(reason)
    integral = (values.size > 0 and (np.issubdtype(values.dtype, np.integer)
                or (np.issubdtype(values.dtype, np.floating)
                    and bool(np.all(values == np.round(values))))))
  except Exception:  # noqa: BLE001 - whatever cannot be read is refused below
    integral = False
  if not integral:
    raise TypeError(
        f"reason_name takes a Result.reason (an integer, or an array of "
        f"them under vmap), got {reason!r}; it is one of {accepted}.")
  # Under vmap every lane stops with the others: one reason for all.
  value = int(values.reshape(-1)[0])
  if value not in _REASON_NAMES:
    raise ValueError(f"reason_name got {value}, which is no reason a "
                     f"steered loop gives; a Result.reason is one of "
                     f"{accepted}.")
  return _REASON_NAMES[value]


class Result(NamedTuple):
  """What a steered loop returns.

  Attributes:
    value: what the plain loop returns (for ``scan``, ``(carry, ys)``; the
      rows of ``ys`` past ``steps`` are zeros).
    stopped: whether it stopped early (a bool array).
    steps: how many steps it ran (an int32 array).
    reason: why it stopped: 0 (it did not), ``INTERRUPTED``,
      ``TIME_LIMIT`` or ``STOP_WHEN``; ``reason_name`` spells it.
  """

  value: Any
  stopped: Any
  steps: Any
  reason: Any


@dataclasses.dataclass(frozen=True)
class LoopStatus:
  """What ``stop_when`` is told after each chunk of a steered loop.

  Attributes:
    steps: the steps the loop has run (on the device that ticked).
    elapsed: seconds since the loop started.
    device: the device that ticked.
  """

  steps: int
  elapsed: float
  device: Any


@dataclasses.dataclass(frozen=True)
class Stop:
  """When a steered loop stops early (hashable: part of the call site)."""

  interruptible: bool = False
  time_limit: float | None = None
  stop_when: Callable | None = dataclasses.field(default=None, compare=False)
  stop_when_key: Any = dataclasses.field(init=False, default=None)

  def __post_init__(self):
    object.__setattr__(self, "stop_when_key", None if self.stop_when is None
                       else hash_key(self.stop_when))

  @classmethod
  def of(cls, interruptible, time_limit, stop_when) -> "Stop | None":
    """The spec of these options, checked; None when none is set."""
    if not isinstance(interruptible, bool):
      raise TypeError(f"interruptible must be True or False, got "
                      f"{interruptible!r}")
    if time_limit is not None:
      time_limit = _seconds(time_limit)
    if stop_when is not None and not callable(stop_when):
      raise TypeError(
          f"stop_when must be a function of a hostcall.control.LoopStatus "
          f"returning a bool, got {stop_when!r}")
    if not interruptible and time_limit is None and stop_when is None:
      return None
    return cls(interruptible, time_limit, stop_when)


# The largest time limit the native clock can hold, in microseconds (its
# deadline is nanoseconds of the steady clock in an int64): any longer
# limit is never reached, and is passed as none.
_MAX_LIMIT_US = 2**62 // 1000


def _seconds(time_limit) -> float:
  """``time_limit=`` as a float of seconds > 0 (``inf``: no limit), or a
  ``ValueError`` (whatever came) naming what came and what to pass."""
  expected = "time_limit is a number of seconds > 0 (math.inf: no limit)"
  fix = "Pass a Python number of seconds, e.g. time_limit=3600.0."
  if isinstance(time_limit, _jax_private.Tracer):
    raise ValueError(
        f"{expected}, known when the loop is traced (the host keeps the "
        f"deadline), got a traced value ({time_limit!r}). {fix} To vary it "
        "between calls of a jitted function, make it a static argument "
        "(jax.jit(..., static_argnames=...)).")
  if (isinstance(time_limit, (bool, np.bool_))
      or not isinstance(time_limit, numbers.Real)
      or not float(time_limit) > 0):  # NaN too
    raise ValueError(f"{expected}, got {time_limit!r} of type "
                     f"{type(time_limit).__name__}. {fix}")
  return float(time_limit)


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


def _frame_waiting_for_the_loop():
  """The frame of the calling thread that waits for the computation running
  this host function, a loop's open (it returns when the computation ends,
  whether it finished or failed), or None: where the runtime runs it in a
  thread of its own, with no Python frame below the callback, or where the
  open is a computation of its own, the loop another (outside ``jit``)."""
  frame = sys._getframe(1)
  while frame is not None and not _jax_private.is_callback_frame(frame):
    frame = frame.f_back
  while frame is not None and _jax_private.is_callback_frame(frame):
    frame = frame.f_back
  caller = frame
  while caller is not None and _jax_private.is_jax_frame(caller):
    caller = caller.f_back
  if caller is not None and is_eager_call(caller):
    return None
  return frame


def _on_stack(top, frame) -> bool:
  while top is not None:
    if top is frame:
      return True
    top = top.f_back
  return False


class _Reaper:
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
               if not _on_stack(stacks.get(thread), frame)]
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
    self._reaper = _Reaper(self.end)

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
      frame = _frame_waiting_for_the_loop()
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
          -1 if limit is None or limit * 1e6 >= _MAX_LIMIT_US
          else int(limit * 1e6), int(stop.interruptible),
          int(stop.stop_when is not None))
    # Started after the native clock: a predicate never sees more time
    # elapsed than the check that compares it with the time limit.
    with self._lock:
      self._open[handle] = (group, stop, time.monotonic())
    if lib is not None:
      return
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


# --- the device side: the check ----------------------------------------------

control_check_p = jex_core.Primitive("hostcall_control_check")

_INT = np.int32


def data_leaves(tree) -> list:
  """The leaves of ``tree`` as plain arrays: PRNG keys as their key data,
  symbolic-zero (float0) leaves left out."""
  leaves = []
  for leaf in jax.tree_util.tree_leaves(tree):
    leaf = jnp.asarray(leaf) if not hasattr(leaf, "dtype") else leaf
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended):
      leaf = jax.random.key_data(leaf)
    if leaf.dtype != jax.dtypes.float0:
      leaves.append(leaf)
  return leaves


def witness(tree) -> jax.Array:
  """One float32 read from every leaf of ``tree`` (shape (1,), or (0,)
  where it holds no data): an operand that waits for all of ``tree``."""
  total = jnp.zeros((0,), jnp.float32)
  for leaf in data_leaves(tree):
    leaf = jnp.ravel(leaf)
    if leaf.size:
      part = leaf[:1]
      part = jnp.abs(part) if jnp.iscomplexobj(part) else part
      total = (total if total.size else 0) + part.astype(jnp.float32)
  return total


def check(handle, index, after=None) -> jax.Array:
  """The stop check of a steered loop: 0 to go on, else the reason to stop.

  Arguments:
    handle: the invocation's handle (what the loop's open returned).
    index: how many checks this invocation has made before, plus one.
    after: the chunk's results: the check waits for them (else XLA may ask
      at the chunk's start, when the host has yet to see the last chunk).
  """
  # An operand, not an ordering hint: XLA schedules a side-effecting call
  # as early as its operands allow.
  reason = control_check_p.bind(jnp.asarray(handle, _INT).reshape(()),
                                jnp.asarray(index, _INT).reshape(()),
                                witness(after))
  names = _jax_private.collective_axis_names()
  if names and jax.process_count() > 1:
    # Inside shard_map or pmap each device asks its own process's host;
    # the devices of one process agree already (hostcall_control.cc),
    # those of other processes (another host's clock, Ctrl-C, predicate,
    # a contained failure) through this reduction, so that no device
    # leaves a loop whose collectives its peers still run. In one process
    # no collective is added: a device that fails outside hostcall's host
    # functions (an XLA error, JAX's own callbacks) never leaves its peers
    # waiting in one.
    reason = jax.lax.pmax(reason, names)
  return reason


def _abstract_eval(handle, index, after):
  del handle, index, after
  return _jax_private.ShapedArray((), _INT)


def _batching_rule(args, dims):
  # Every lane of a loop stops together: one check for the batch (the
  # handle is the same in every lane; the latest lane's index counts; the
  # check waits for every lane's results).
  handle, index, after = [a if d is None else jnp.moveaxis(a, d, 0).reshape(-1)
                          for a, d in zip(args, dims)]
  handle = handle if jnp.ndim(handle) == 0 else handle[0]
  index = index if jnp.ndim(index) == 0 else jnp.max(index)
  after = after if after.size <= 1 else jnp.sum(after, keepdims=True)
  return control_check_p.bind(handle, index, after.reshape(-1)[:1]), None


def _jvp_rule(primals, tangents):
  del tangents
  out = control_check_p.bind(*primals)
  return out, _jax_private.Zero(jax.typeof(out).to_tangent_aval())


def _remat_rule(saveable, unks_in, inst_in, eqn):
  # Asked once: recomputing the check where the backward pass
  # rematerialises would get another answer.
  del saveable, inst_in
  if any(unks_in):
    return None, eqn, [True], [True], []
  return eqn, None, [False], [False], []


def _lowering(ctx, handle, index, after):
  axis_context = ctx.module_context.axis_context
  global_view = emission.global_view(axis_context)
  if emission.route(ctx, "check", native.load() is not None) == "ffi":
    return jax.ffi.build_ffi_lowering_function(
        "hostcall_control_check", has_side_effect=True)(
            ctx, handle, index, after).results

  def poll(h, i, after):
    del after
    return (np.asarray(controls.poll(int(h), int(i)), _INT),)

  # Under a global view of several devices one device asks, and every
  # device reads its answer (as hostcall's calls with results do).
  chosen = None
  if global_view:
    chosen = jax.sharding.SingleDeviceSharding(
        axis_context.device_assignment[0])
  results, _, _ = _jax_private.emit_python_callback(
      ctx, poll, None, [handle, index, after], list(ctx.avals_in),
      list(ctx.avals_out), has_side_effect=True, returns_token=False,
      sharding=_jax_private.callback_op_sharding(axis_context, chosen,
                                                 list(ctx.avals_out)))
  if chosen is not None:
    results = [_jax_private.replicated(ctx, r, a)
               for r, a in zip(results, ctx.avals_out)]
  return results


control_check_p.def_abstract_eval(_abstract_eval)
control_check_p.def_impl(lambda handle, index, after: jax.jit(
    control_check_p.bind)(handle, index, after))
_jax_private.primitive_batchers[control_check_p] = _batching_rule
_jax_private.primitive_jvps[control_check_p] = _jvp_rule
_jax_private.partial_eval_jaxpr_custom_rules[control_check_p] = _remat_rule
_jax_private.register_lowering(control_check_p, _lowering)
