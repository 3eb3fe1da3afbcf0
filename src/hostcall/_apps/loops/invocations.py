"""The host side of every chunked loop (``invocations``): the registry of
their invocations, which its listeners follow.

A chunked loop (a progress loop, a steered loop, a body decorated by
``track``) sends its events from the device (``events.py``): *open*
before its first step, a *tick* with the step count after each chunk of
steps, *close* after its last step, and, for a ``while_loop`` the host
paces, *pace* (how many steps to run before its next tick). Every device
that runs the loop sends its own; the k-th invocation of a loop (its
*site*) on one device is the k-th invocation on every other device, so that
the devices of one invocation, its *group* ``(site, k)``, share a pace, a
bar and a stop decision.

``Invocations`` keeps them (handles, groups, paces) and tells its listeners,
which register with ``listen``: a progress bar (``progress.bars.Bars``: tqdm's
drawing) and a steered loop's host side (``control.controls``). A loop that no
bar draws (``hostcall.control.while_loop``) has a site whose spec is
``NoBarSpec``, which no drawing listener draws.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import sys
import threading
import time
from typing import Any

import numpy as np

from hostcall._apps.loops.listener import Listener
from hostcall._apps.loops.raise_after_all import RaiseAfterAll
from hostcall._core.context import enclosing_call_started
from hostcall._runtime import enqueue as _enqueue, tap_queue as _queue
from hostcall._runtime.barriers import add_barrier_hook, barrier_started
from hostcall._runtime.calls import add_abort_hook
from hostcall._runtime.waiting_frames import (
    dispatching, frame_waiting_for_the_computation, on_stack)

#: Seconds between two ticks that a while_loop's pace aims for (a bar
#: redraws at most this often anyway).
TICK_INTERVAL = 0.1

#: The first handle a device makes for an invocation whose open it queues
#: (``enqueue.emit_new_handle``); the registry's own are below it.
DEVICE_HANDLES = _enqueue.DEVICE_HANDLES

#: The opener of an invocation whose open was queued without its thread
#: (a global view of several devices, whose opens have no handle of their
#: own): the failure of any computation ends it, as the host cannot tell
#: which computation it was.
QUEUED = "queued"


@dataclasses.dataclass(frozen=True)
class NoBarSpec:
  """The spec of a loop's site where no bar draws it
  (``hostcall.control.while_loop``): its nesting depth and whether Ctrl-C
  stops it tell its sites apart, as a bar's spec does. (The k-th
  invocation of a site on each device is one invocation: loops that share
  a site must not be counted apart, on a device that skips some, from those
  of another site.)"""

  position: int
  interruptible: bool

  total = None  # its steps are never known in advance


class Invocation:
  """One device's run of one invocation of a loop (what its handle names).

  Attributes:
    handle: the number the loop's events carry.
    site: the loop's site; ``spec`` its spec (a ``progress.bars.BarSpec``, or
      ``NoBarSpec`` for a loop no bar draws).
    device: the device that runs it.
    group: ``(site, k)``: the invocation, shared by every device running it.
    total: its number of steps, or None where unknown.
    context: the open's call context (None outside one).
    peers: this process's devices that run the invocation (shard_map, pmap).
    opener: the thread that opened it, the thread running its
      computation (``QUEUED``: a queued open that did not say).
    waiter: for a live open, the frame waiting for its computation
      (``waiting_frames``), else None; ``waiting_at`` the instruction it
      waited at.
    opened: when (``time.monotonic()``): for a queued open whose device
      made its handle, when the device made it, as for a live open.
    steps: the steps ``step`` counted (a decorated body's).
    stop: what its open carried where the loop is steered (a
      ``hostcall.control`` ``Stop``, which the engine never reads), else
      None.
  """

  __slots__ = ("handle", "site", "spec", "device", "group", "total",
               "context", "peers", "opener", "waiter", "waiting_at",
               "opened", "steps", "stop")

  def __init__(self, handle, site, spec, device, group, total, context,
               peers, opener, stop=None, waiter=None):
    self.handle, self.site, self.spec, self.device = handle, site, spec, device
    self.group, self.total, self.context = group, total, context
    self.peers, self.opener, self.stop = peers, opener, stop
    self.waiter = waiter
    self.waiting_at = None if waiter is None else waiter.f_lasti
    self.opened = time.monotonic()
    self.steps = 0


class _Group:
  """One invocation of a loop on this process's devices, until each that
  runs it has ended: its devices share a pace and a stop decision."""

  __slots__ = ("open", "ended", "expected", "opened")

  def __init__(self):
    self.open: set[int] = set()   # handles of devices running it now
    self.ended: set = set()       # devices whose run of it has ended
    # This process's devices that run it (shard_map, pmap), also those
    # that have not opened it yet.
    self.expected: set = set()
    self.opened = time.monotonic()

  def over(self) -> bool:
    return not self.open and self.ended >= self.expected


class Invocations:
  """Every chunked loop's invocations in this process; thread-safe (devices
  call from their own threads)."""

  #: Invocations waiting for a device that never opened them kept at most
  #: (the oldest beyond are released), so that the registry stays flat
  #: over any number of invocations; listeners keep as many.
  KEPT = 1024

  def __init__(self):
    self._lock = threading.RLock()
    self._listeners: list[Listener] = []
    self._specs: dict[Any, int] = {}
    self._by_site: list = []
    self._counts: collections.Counter = collections.Counter()
    # (site, device) -> the handle its latest open got.
    self._latest: dict[tuple, int] = {}
    # An open invocation's handle -> its Invocation.
    self._open: dict[int, Invocation] = {}
    self._handles = itertools.count(1)
    # handle -> (when it last asked, steps it was given, answers it had);
    # an invocation's group -> the paces given, in order.
    self._paces: dict[int, tuple[float, int, int]] = {}
    self._group_paces: dict[tuple, list[int]] = {}
    self._steps: dict[tuple, int] = {}  # (site, device) -> track()'s handle
    # group -> its _Group, until every device of it has ended.
    self._running: collections.OrderedDict = collections.OrderedDict()

  def listen(self, listener: Listener) -> None:
    """``listener`` follows every invocation from now on."""
    with self._lock:
      if listener not in self._listeners:
        self._listeners.append(listener)

  def _tell(self, event: str, *args) -> None:
    """Calls each listener's ``event``; one that raises does not keep the
    others from it (the first failure is raised after)."""
    # (RaiseAfterAll's loop written out: every open and close comes here.)
    failure = None
    for listener in list(self._listeners):
      try:
        getattr(listener, event)(*args)
      except Exception as exc:  # noqa: BLE001 - raised after the others
        failure = failure or exc
    if failure is not None:
      raise failure

  def site(self, spec) -> int:
    """The site number of a loop; equal specs share one (and a
    compilation). ``spec``: its bar's ``BarSpec``, or ``NoBarSpec``."""
    with self._lock:
      if spec not in self._specs:
        self._specs[spec] = len(self._by_site)
        self._by_site.append(spec)
      return self._specs[spec]

  def spec(self, site: int):
    """The spec of a site."""
    with self._lock:
      return self._by_site[site]

  def open(self, site: int, device, total: int | None, context=None,
           queued: bool = False, stop=None, handle: int | None = None,
           opened: float | None = None, thread: int | None = None) -> int:
    """Opens (or joins, for another device) this device's next invocation
    of the loop; returns the invocation's handle. ``queued``: the open was
    queued (``hostcall.jit``), not made by the thread that runs the loop's
    computation; ``stop``: a steered loop's (``Invocation.stop``);
    ``handle``: the one its device made (``DEVICE_HANDLES``), if any,
    ``opened`` when (``time.monotonic()``; else now) and ``thread`` on
    which thread (``threading.get_ident()``'s; else the caller's, or for a
    queued open ``QUEUED``)."""
    waiter = None
    if thread is None and not queued:
      thread = threading.get_ident()
      waiter = frame_waiting_for_the_computation()
    handle, invocation = self._open_here(site, device, total, context,
                                         thread or QUEUED, stop, handle,
                                         opened, waiter)
    self._tell("on_opened", invocation)
    return handle

  def _open_here(self, site, device, total, context, thread, stop, handle,
                 opened, waiter):
    """``open``'s registration, under the lock: ``(handle, invocation)``."""
    with self._lock:
      index = self._counts[(site, device)]
      self._counts[(site, device)] += 1
      if handle is None:
        handle = (next(self._handles) - 1) % (DEVICE_HANDLES - 1) + 1
      # This process's devices that run the loop (shard_map, pmap).
      process = getattr(device, "process_index", 0)
      peers = [d for d in getattr(context, "peers", ())
               if getattr(d, "process_index", 0) == process]
      invocation = Invocation(
          handle, site, self._by_site[site], device, (site, index), total,
          context, peers, thread, stop, waiter)
      if opened is not None:
        # (A barrier ends what was opened before it: a queued open may
        # reach the host during the barrier, after its computation failed.)
        invocation.opened = opened
      for listener in list(self._listeners):
        listener.on_open(invocation)  # a listener that refuses fails the open
      self._open[handle] = invocation
      self._latest[(site, device)] = handle
      group = self._running.get(invocation.group)
      if group is None:
        group = self._running[invocation.group] = _Group()
        self._release_forgotten()
      group.open.add(handle)
      group.expected.update(peers)
      self._paces[handle] = (time.monotonic(), 0, 0)
      return handle, invocation

  def latest(self, site: int, device) -> int:
    """The handle of this device's latest invocation of ``site`` (the one
    a queued event of the site belongs to: see ``events.LATEST``)."""
    with self._lock:
      return self._latest.get((site, device), -1)

  def tick(self, handle: int, device, count: int, lanes: int | None = None,
           running: int | None = None, values: tuple | None = None) -> None:
    """The loop has run ``count`` steps on ``device`` (``values``: as
    ``Listener.on_tick`` takes them)."""
    each = RaiseAfterAll()
    try:
      with self._lock:
        invocation = self._open.get(handle)
        if invocation is not None:  # (else already ended)
          with each:
            self._tell("on_tick", invocation, count, lanes, running, values)
    finally:
      # A steered loop's check waits until its predicate has seen this
      # tick: a bar that fails to draw must not keep the loop waiting.
      for listener in list(self._listeners):
        with each:
          listener.on_ticked(handle, count, device)
    each.raise_first()

  def follows_every_tick(self, site: int, handle: int) -> bool:
    """Whether a listener must see each tick of the invocation ``handle``
    of ``site`` (see ``Listener.follows_every_tick``)."""
    with self._lock:
      spec = self._by_site[site]
      return any(listener.follows_every_tick(spec, handle)
                 for listener in list(self._listeners))

  def finish(self, handle: int, reason: int) -> None:
    """A steered loop stopped on a device (``Listener.on_finish``), open
    or not."""
    self._tell("on_finish", handle, reason)

  def close(self, handle: int, device, count: int,
            lanes: int | None = None, stopped: bool = False,
            values: tuple | None = None) -> None:
    """The loop ended on ``device`` after ``count`` steps (``stopped``: a
    steered loop stopped early; ``values``: its body's last, told to
    ``on_tick`` first, as the close may overtake the last tick)."""
    del device
    with self._lock:
      invocation = self._open.get(handle)
      try:
        if values is not None and invocation is not None:
          self._tell("on_tick", invocation, count, lanes, None, values)
      finally:
        self._end(handle, count=count, lanes=lanes, stopped=stopped)

  def step(self, site: int, device, steps: int, lanes: int | None,
           context=None, values: tuple | None = None) -> None:
    """``steps`` more steps of a loop whose body alone is decorated: the
    first opens an invocation, reaching the spec's total ends it."""
    with self._lock:
      handle = self._steps.get((site, device))
      if handle is None or handle not in self._open:
        handle = self._steps[(site, device)] = self.open(
            site, device, self._by_site[site].total, context)
      invocation = self._open[handle]
      invocation.steps += steps
      try:
        self._tell("on_tick", invocation, invocation.steps, lanes, None,
                   values)
      finally:
        total = invocation.total
        if total is not None and invocation.steps >= total:
          self._end(handle)

  def pace(self, handle: int, device) -> int:
    """How many steps a while_loop runs before its next tick: about
    ``TICK_INTERVAL`` seconds' worth at the rate measured so far. Every
    device of one invocation gets the same answers, in the same order (the
    first to ask decides): a body that communicates (``psum``) must run the
    same steps between two checks on each."""
    del device
    with self._lock:
      now = time.monotonic()
      then, steps, asked = self._paces.get(handle, (now, 0, 0))
      invocation = self._open.get(handle)
      answers = self._group_paces.setdefault(
          None if invocation is None else invocation.group, [])
      if asked < len(answers):
        following = answers[asked]
      else:
        if steps == 0:
          following = 1
        else:
          rate = steps / max(now - then, 1e-6)
          following = int(min(max(rate * TICK_INTERVAL, 1), 2 * steps))
        following = min(following, 1 << 30)
        answers.append(following)
      self._paces[handle] = (now, following, asked + 1)
      return following

  def group_of(self, handle: int) -> tuple[int, int] | None:
    """``(site, index)`` of the invocation ``handle`` belongs to, while it
    is open."""
    with self._lock:
      invocation = self._open.get(handle)
      return None if invocation is None else invocation.group

  def close_all(self, stopped: bool = False, thread: int | str | None = None,
                opened_before: float | None = None,
                opened_after: float | None = None) -> None:
    """Ends the open invocations (those opened by ``thread``, or before
    ``opened_before`` but for those whose computation another thread still
    runs, and every ``track`` counter): their loops ended without closing
    them. Ended by ``opened_before`` (a barrier's), a loop stopped early
    where its computation failed (``_failed``); a ``track`` counter did
    not (its steps are counted across calls until a barrier).
    ``opened_after``: only those opened since then."""
    each = RaiseAfterAll()
    stacks = None
    with self._lock:
      counters = set(self._steps.values())
      for handle, invocation in list(self._open.items()):
        if thread is not None and invocation.opener != thread:
          continue
        if opened_after is not None and invocation.opened < opened_after:
          continue
        if opened_before is not None and handle not in counters:
          if invocation.opened >= opened_before:
            continue
          if stacks is None:
            stacks = sys._current_frames()
            stacks.pop(threading.get_ident(), None)
          if _runs_elsewhere(invocation, stacks):
            continue
        with each:
          self._end(handle, stopped=stopped or (
              opened_before is not None and handle not in counters
              and _failed(invocation, stacks)),
                    force=opened_before is not None)
      if opened_before is not None:
        # An invocation still waiting for a device that never opened it
        # (its computation failed first) once every other device has
        # ended.
        for group, waiting in list(self._running.items()):
          if not waiting.open and waiting.opened < opened_before:
            with each:
              self._release(group)
        with each:
          self._tell("on_stale", opened_before)
    del stacks  # every thread's frames: let them go now
    each.raise_first()

  def _release(self, group: tuple[int, int]) -> None:
    """Every device of the invocation ``group`` has ended (or never will):
    its paces and what listeners keep for it are forgotten."""
    del self._running[group]
    self._group_paces.pop(group, None)
    self._tell("on_release", group)

  def _release_forgotten(self) -> None:
    # Waiting invocations (a device that never opened one: its computation
    # failed) are released at the next barrier; without barriers, the
    # oldest beyond a bound.
    if len(self._running) <= self.KEPT:
      return
    for group, waiting in list(self._running.items()):
      if len(self._running) <= self.KEPT:
        break
      if not waiting.open:
        self._release(group)

  def _end(self, handle: int, count: int | None = None,
           lanes: int | None = None, stopped: bool = False,
           force: bool = False) -> None:
    """Ends an invocation on its device (``force``: the barrier's, no
    device that has not opened it by then ever will)."""
    invocation = self._open.pop(handle, None)
    if invocation is None:
      return
    self._paces.pop(handle, None)
    each = RaiseAfterAll()
    with each:
      self._tell("on_end", invocation, count, lanes, stopped, force)
    group = self._running.get(invocation.group)
    if group is not None:
      group.open.discard(handle)
      group.ended.add(invocation.device)
      # (Forced by a barrier: not while another device runs it, in a
      # computation another thread dispatched.)
      if group.over() or (force and not group.open):
        with each:
          self._release(invocation.group)
    each.raise_first()


invocations = Invocations()


def _runs_elsewhere(invocation: Invocation, stacks: dict) -> bool:
  """Whether another thread still waits for ``invocation``'s computation
  (``stacks``: the other threads' top frames): a barrier in this thread
  must not end it. (A thread that ran it and has moved on, or a queued
  open that did not say its thread: it ended, or failed.)"""
  top = stacks.get(invocation.opener)
  if top is None:
    return False
  waiter = invocation.waiter
  if waiter is not None:
    # (Still at the call: a frame that has moved on, to another call, no
    # longer waits for this computation.)
    return (on_stack(top, waiter)
            and waiter.f_lasti == invocation.waiting_at)
  return dispatching(top)


def _failed(invocation, stacks) -> bool:
  """Whether a barrier that ends ``invocation`` knows its computation
  failed: its thread (``stacks``: every other thread's frames) is one of
  Python's and no longer runs it. A computation the runtime ran on a
  thread of its own (an asynchronously dispatched program) may still be
  running: its loop is ended, not marked stopped."""
  opener = invocation.opener
  return opener == threading.get_ident() or (stacks is not None
                                             and opener in stacks)


def _computation_failed() -> None:
  # Its loops will send no more events: deliver those already queued, then
  # end what it opened (on the thread that runs it and now fails, live or
  # through the queue; or through the queue not saying its thread). Where
  # a host call on this thread ran it, what was opened before that call
  # belongs to a computation still running below it.
  _queue.consumer.drain(timeout=5.0)
  since = enclosing_call_started()
  invocations.close_all(stopped=True, thread=threading.get_ident(),
                        opened_after=since)
  invocations.close_all(stopped=True, thread=QUEUED, opened_after=since)


def _after_barrier() -> None:
  # A loop whose computation failed elsewhere never closed its invocation
  # either: every computation started before the barrier has ended (a
  # queued open counts from when its device made its handle).
  invocations.close_all(opened_before=barrier_started())


add_abort_hook(_computation_failed)
add_barrier_hook(_after_barrier)


def lanes_of(context) -> int | None:
  """The number of vmap lanes of a call, or None outside vmap."""
  if context is None or not context.batch_levels:
    return None
  return math.prod(size for _, size in context.batch_levels)


def last_count(counts: np.ndarray) -> int:
  """The step count a tick reports: the furthest lane's."""
  counts = np.asarray(counts)
  if counts.size == 1:  # (no lanes: a reduction costs more than the rest)
    return int(counts.item())
  return int(counts.max()) if counts.size else 0
