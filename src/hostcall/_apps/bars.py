"""The host side of progress bars: one tqdm bar per loop invocation.

Device code (``bar_events.py``) sends four kinds of events from the loop it
wraps: *open* before the first step, *tick* with the step count after every
chunk of steps, *close* after the last step (all three asynchronous: they
arrive in the order the device sent them) and *pace* (a ``while_loop``
asking, synchronously, how many steps to run before its next tick). Every
device that runs the loop sends its own events; they are merged here into
one bar per invocation. The k-th invocation of a loop on one device is the
k-th invocation on every other device, so the bar of an invocation is keyed
by ``(site, k)``.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import threading
import time
from typing import Any

import numpy as np

from hostcall._apps import tqdm_guard
from hostcall._runtime import queue as _queue
from hostcall._runtime.barriers import add_barrier_hook, barrier_started
from hostcall._runtime.calls import add_abort_hook

#: Seconds between two ticks that a while_loop's pace aims for (the bar
#: redraws at most this often anyway).
TICK_INTERVAL = 0.1


@dataclasses.dataclass(frozen=True)
class BarSpec:
  """What a loop's bar looks like; static, fixed when the loop is traced."""

  desc: str | None
  total: int | None
  unit: str
  position: int  # the loop's nesting depth among compiled loops
  leave: bool | None  # None: tqdm's default, only a bar on the top row
  file: Any
  all_processes: bool
  options: tuple  # further tqdm keyword arguments, as sorted items

  def make(self, total, stream: "tqdm_guard.Guarded | None"):
    """A tqdm bar drawing on ``stream`` (``guard``'s: None for a notebook
    widget)."""
    tqdm = tqdm_guard.tqdm_class(self.file)
    options = dict(mininterval=TICK_INTERVAL,
                   dynamic_ncols=self.file is None)
    options.update(self.options)
    position = self.position + tqdm_guard.loop_rows.rows()
    return tqdm_guard.make(tqdm, total=total, desc=self.desc,
                           unit=self.unit, position=position,
                           leave=self.leave_at(position), file=stream,
                           **options)

  def leave_at(self, position: int) -> bool:
    """Whether the bar stays on screen when done, drawn at row
    ``position``: as given, else only on the top row (tqdm's default:
    a nested bar, under another progress loop's or a Python loop's, is
    erased)."""
    return position == 0 if self.leave is None else self.leave

  def guard(self) -> "tqdm_guard.Guarded | None":
    """What a bar draws on: the spec's file (or the terminal's stderr), its
    failures kept for hostcall to raise; None where tqdm draws a notebook
    widget."""
    if self.file is None:
      if tqdm_guard.is_notebook_bar(tqdm_guard.tqdm_class(None)):
        return None
      import sys
      return tqdm_guard.Guarded(sys.stderr)
    return tqdm_guard.Guarded(self.file)


class _Bar:
  """One invocation's bar, merged over the devices that run the loop."""

  def __init__(self, spec: BarSpec, total: int | None):
    self.counts: dict[Any, int] = {}
    self.closed: set = set()
    self.stopped = False  # a device's loop ended early (its computation failed)
    # This process's devices that run the loop (shard_map, pmap): the bar
    # waits for each, also one that has not opened it yet.
    self.expected: set = set()
    self.opened = time.monotonic()
    self.lanes: int | None = None
    self.running: dict[Any, int] = {}
    self.stream = spec.guard()
    with tqdm_guard.unlocked_on_failure():
      self.tqdm = spec.make(total, self.stream)
    try:
      self._drawn()
    except BaseException:
      # Not opened: the bar tqdm made must not keep its row.
      with tqdm_guard.unlocked_on_failure():
        self.tqdm.close()
      self.stream.failure = None
      raise

  @property
  def is_open(self) -> bool:
    return self.tqdm is not None

  def devices(self) -> set:
    return set(self.counts) | self.expected

  def show(self, final: bool = False) -> None:
    n = min(self.counts.get(d, 0) for d in self.devices())  # the slowest
    postfix = []
    if self.lanes is not None:
      if self.running:
        postfix.append(f"lanes {sum(self.running.values())}/{self.lanes}")
      else:
        postfix.append(f"lanes {self.lanes}")
    with tqdm_guard.unlocked_on_failure():
      if postfix:
        self.tqdm.set_postfix_str(", ".join(postfix), refresh=False)
      if final:
        # Closing draws the final state once; an update now would draw the
        # same line twice where the output is not a terminal.
        self.tqdm.n = n
      elif n > self.tqdm.n:
        self.tqdm.update(n - self.tqdm.n)  # redraws at most every mininterval
    self._drawn()

  def _drawn(self) -> None:
    """Raises what the stream raised while tqdm drew (see
    ``tqdm_guard.Guarded``)."""
    if self.stream is not None:
      self.stream.raise_failure()

  def finish(self, stopped: bool = False) -> None:
    if self.tqdm is None:
      return
    try:
      with tqdm_guard.unlocked_on_failure():
        if stopped:
          self.tqdm.set_postfix_str("stopped", refresh=False)
        self.tqdm.close()
        if stopped and self.tqdm.total is None:
          # A notebook's widget marks a bar that closed short of its total
          # as failed, any other as a success: a stopped counter is no
          # success.
          paint = getattr(self.tqdm, "disp", None)
          if (paint is not None
              and tqdm_guard.is_notebook_bar(type(self.tqdm))):
            paint(bar_style="danger", check_delay=False)
    finally:
      self.tqdm = None
    self._drawn()


class _Invocation:
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


class Bars:
  """Every progress bar of this process; thread-safe (devices call from their
  own threads)."""

  #: Bars kept findable after their invocation, for devices that open them
  #: late (the newest; older ones are forgotten, so the registry stays flat
  #: over any number of invocations).
  KEPT_BARS = 1024

  def __init__(self):
    self._lock = threading.RLock()
    self._specs: dict[BarSpec, int] = {}
    self._by_site: list[BarSpec] = []
    self._invocations: collections.Counter = collections.Counter()
    # (site, device) -> the handle its latest open got.
    self._latest: dict[tuple, int] = {}
    # Bars stay findable after closing, for devices that open them late.
    self._bars: collections.OrderedDict = collections.OrderedDict()
    # An invocation's handle -> (bar or None where not drawn, device, the
    # thread that opened it, when).
    self._open: dict[int, tuple] = {}
    self._handles = itertools.count(1)
    # handle -> (when it last asked, steps it was given, answers it had);
    # an invocation's (site, index) -> the paces given, in order.
    self._paces: dict[int, tuple[float, int, int]] = {}
    self._group_paces: dict[tuple, list[int]] = {}
    self._steps: dict[tuple, int] = {}  # (site, device) -> track()'s handle
    # An invocation's handle -> (site, index): the k-th invocation of a site
    # on every device is one invocation, whose devices share a bar.
    self._groups: dict[int, tuple[int, int]] = {}
    # (site, index) -> the invocation, until every device of it has ended.
    self._running: collections.OrderedDict = collections.OrderedDict()
    #: Called with a handle when its invocation ends (or is ended) on its
    #: device.
    self.end_hooks: list = []
    #: Called with ``(site, index)`` once every device of the invocation
    #: has ended (or the barrier decided that the rest never will open it).
    self.release_hooks: list = []

  def site(self, spec: BarSpec) -> int:
    """The site number of a loop; equal specs share one (and a compilation)."""
    with self._lock:
      if spec not in self._specs:
        self._specs[spec] = len(self._by_site)
        self._by_site.append(spec)
      return self._specs[spec]

  def open(self, site: int, device, total: int | None, context=None,
           queued: bool = False) -> int:
    """Opens (or joins, for another device) the bar of this device's next
    invocation of the loop; returns the invocation's handle. ``queued``:
    the open was queued (``hostcall.jit``), not made by the thread that
    runs the loop's computation."""
    with self._lock:
      spec = self._by_site[site]
      index = self._invocations[(site, device)]
      self._invocations[(site, device)] += 1
      handle = next(self._handles) & 0x7FFFFFFF
      # This process's devices that run the loop (shard_map, pmap).
      process = getattr(device, "process_index", 0)
      peers = [d for d in getattr(context, "peers", ())
               if getattr(d, "process_index", 0) == process]
      bar = None
      if (context is None or spec.all_processes or
          context.process_index == 0):  # else drawn by process 0 only
        bar = self._bars.get((site, index))
        if bar is None:
          bar = self._bars[(site, index)] = _Bar(spec, total)
          while len(self._bars) > self.KEPT_BARS:
            self._bars.popitem(last=False)
        if bar.is_open:
          bar.counts[device] = 0
          bar.expected.update(peers)
        else:
          bar = None
      self._open[handle] = (bar, device,
                            QUEUED if queued else threading.get_ident(),
                            time.monotonic())
      self._latest[(site, device)] = handle
      self._groups[handle] = (site, index)
      invocation = self._running.get((site, index))
      if invocation is None:
        invocation = self._running[(site, index)] = _Invocation()
        self._release_forgotten()
      invocation.open.add(handle)
      invocation.expected.update(peers)
      self._paces[handle] = (time.monotonic(), 0, 0)
      return handle

  def latest(self, site: int, device) -> int:
    """The handle of this device's latest invocation of ``site`` (the one
    a queued event of the site belongs to: see ``bar_events.LATEST``)."""
    with self._lock:
      return self._latest.get((site, device), -1)

  def tick(self, handle: int, device, count: int, lanes: int | None = None,
           running: int | None = None) -> None:
    with self._lock:
      bar = self._open.get(handle, (None,))[0]
      if bar is None or not bar.is_open:
        return  # not drawn here, or already closed
      bar.counts[device] = max(count, bar.counts[device])
      bar.lanes = lanes
      if running is not None:
        bar.running[device] = running
      bar.show()

  def close(self, handle: int, device, count: int,
            lanes: int | None = None, stopped: bool = False) -> None:
    """The loop ended on ``device`` after ``count`` steps (``stopped``: a
    steered loop stopped early, which its bar shows)."""
    with self._lock:
      bar = self._open.get(handle, (None,))[0]
      if bar is not None and bar.is_open:
        bar.counts[device] = count
        bar.lanes = lanes
        bar.running.pop(device, None)
      self._end(handle, stopped=stopped)

  def step(self, site: int, device, steps: int, lanes: int | None,
           context=None) -> None:
    """``steps`` more steps of a loop whose body alone is decorated: the
    first opens a bar, reaching the spec's total closes it."""
    with self._lock:
      handle = self._steps.get((site, device))
      if handle is None or handle not in self._open:
        handle = self._steps[(site, device)] = self.open(
            site, device, self._by_site[site].total, context)
      bar = self._open[handle][0]
      if bar is None or not bar.is_open:
        return
      bar.counts[device] += steps
      bar.lanes = lanes
      bar.show()
      total = self._by_site[site].total
      if total is not None and bar.counts[device] >= total:
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
      answers = self._group_paces.setdefault(self._groups.get(handle), [])
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

  def close_all(self, stopped: bool = False, thread: int | str | None = None,
                opened_before: float | None = None) -> None:
    """Closes the open bars (of invocations opened by ``thread``, or before
    ``opened_before``, and every ``track`` counter): their loops ended
    without closing them."""
    each = _EachAlone()
    with self._lock:
      counters = set(self._steps.values())
      for handle, (_, _, opener, opened) in list(self._open.items()):
        if thread is not None and opener != thread:
          continue
        if (opened_before is not None and opened >= opened_before
            and handle not in counters):
          continue
        with each:
          self._end(handle, stopped=stopped,
                    force=opened_before is not None)
      if opened_before is not None:
        # An invocation, and a bar, still waiting for a device that never
        # opened it (its computation failed first) once every other device
        # has ended.
        for group, invocation in list(self._running.items()):
          if not invocation.open and invocation.opened < opened_before:
            self._release(group)
        waiting = {id(bar) for bar, *_ in self._open.values()}
        for bar in self._bars.values():
          if (bar.is_open and bar.opened < opened_before
              and id(bar) not in waiting):
            with each:
              try:
                bar.show(final=True)
              finally:
                bar.finish(stopped=True)
    each.raise_first()

  def _release(self, group: tuple[int, int]) -> None:
    """Every device of the invocation ``group`` has ended (or never will):
    its paces and what hooks keep for it are forgotten."""
    del self._running[group]
    self._group_paces.pop(group, None)
    for hook in self.release_hooks:
      hook(group)

  def _release_forgotten(self) -> None:
    # Waiting invocations (a device that never opened one: its computation
    # failed) are released at the next barrier; without barriers, the
    # oldest beyond a bound, as bars are.
    if len(self._running) <= self.KEPT_BARS:
      return
    for group, invocation in list(self._running.items()):
      if len(self._running) <= self.KEPT_BARS:
        break
      if not invocation.open:
        self._release(group)

  def group_of(self, handle: int) -> tuple[int, int] | None:
    """``(site, index)`` of the invocation ``handle`` belongs to."""
    with self._lock:
      return self._groups.get(handle)

  def _end(self, handle: int, stopped: bool = False,
           force: bool = False) -> None:
    """Ends an invocation on its device; the last of the bar's devices to
    end closes it (``force``: this one, the barrier's, closes it: a device
    that has not opened it by then never will)."""
    bar, device, _, _ = self._open.pop(handle, (None, None, None, None))
    self._paces.pop(handle, None)
    group = self._groups.pop(handle, None)
    if group is not None:
      for hook in self.end_hooks:
        hook(handle)
      invocation = self._running.get(group)
      if invocation is not None:
        invocation.open.discard(handle)
        invocation.ended.add(device)
        # (Forced by a barrier: not while another device runs it, in a
        # computation another thread dispatched.)
        if invocation.over() or (force and not invocation.open):
          self._release(group)
    if bar is None or not bar.is_open:
      return
    bar.closed.add(device)
    # One device's loop stopped (its computation failed) stops the bar,
    # whichever device ends last.
    bar.stopped = bar.stopped or stopped
    if force or bar.closed >= bar.devices():
      bar.show(final=True)
      stopped = bar.stopped
      total = bar.tqdm.total
      if total is not None:  # a known length tells whether it finished
        stopped = stopped or min(
            bar.counts.get(d, 0) for d in bar.devices()) < total
      bar.finish(stopped=stopped)


bars = Bars()


#: The opener of a bar whose open was queued (``hostcall.jit``'s programs,
#: on one device, run one at a time: once the queue is delivered, a bar
#: such an open left open is the failing computation's).
QUEUED = "queued"


class _EachAlone:
  """``with each:`` around each of several steps: one that raises does not
  stop the others (a bar that fails to close must not leave the others
  open); ``raise_first()`` once all have run."""

  def __init__(self):
    self.failure: Exception | None = None

  def __enter__(self):
    return self

  def __exit__(self, kind, failure, traceback):
    if not isinstance(failure, Exception):
      return None  # none, or an interrupt: it goes on
    self.failure = self.failure or failure
    return True

  def raise_first(self) -> None:
    if self.failure is not None:
      raise self.failure


def _computation_failed() -> None:
  # Its loops will send no more events: deliver those already queued, then
  # close what it opened (from the thread that runs it and now fails, or
  # through the queue).
  _queue.consumer.drain(timeout=5.0)
  bars.close_all(stopped=True, thread=threading.get_ident())
  bars.close_all(stopped=True, thread=QUEUED)


def _after_barrier() -> None:
  # A loop whose computation failed elsewhere never closed its bar either:
  # every computation started before the barrier has ended.
  bars.close_all(opened_before=barrier_started())


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
  return int(counts.max()) if counts.size else 0
