"""The host side of progress bars: one tqdm bar per loop invocation.

``Bars`` listens to the loops' invocations (``loops.invocations``'s
registry: the open, ticks and close each device running a loop sends, see
``loops/events.py``) and draws one bar per invocation whose site has a
``BarSpec``, merged over the devices that run it: the k-th invocation of a
loop on one device is the k-th invocation on every other device, so the bar
of an invocation is keyed by its group ``(site, k)``. It follows the
slowest device and closes when the last one ends.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from typing import Any

from hostcall._apps.loops import invocations as _loops
from hostcall._apps.loops.raise_after_all import RaiseAfterAll
from hostcall._apps.progress import postfix as _postfix, tqdm_guard

#: Seconds between two redraws of a bar, at most (a while_loop's pace aims
#: for a tick as often).
TICK_INTERVAL = _loops.TICK_INTERVAL

#: The fraction of a bar's ``mininterval`` within which ``hostcall.jit``'s
#: queue drops a tick after the last one it queued (``tick_interval``).
#: tqdm redraws at the first update at least ``mininterval`` after its last
#: draw; with a tick queued at most this fraction of it after any dropped
#: one, that update comes at most a quarter of ``mininterval`` late: the bar
#: redraws every 1 to 1.25 ``mininterval`` (tqdm's own loop, every 1), and
#: a fast loop queues at most four ticks a ``mininterval`` (40 a second by
#: default), not one a chunk.
THINNED_TICKS = 0.25
#: The longest interval a tick is thinned within, in seconds (a year).
LONGEST_THINNING = 365 * 24 * 3600.0


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

  @property
  def disabled(self) -> bool:
    """Whether the bar is ``disable=True``: tqdm would make a bar that
    draws nothing and takes no row, so none is made (making one cost a
    steered loop's open, which the device waits for, 0.2 ms)."""
    return dict(self.options).get("disable") is True

  @property
  def draws_every_tick(self) -> bool:
    """Whether the bar redraws at every tick (``mininterval=0``): else a
    run of ticks reaching the host at once is drawn at most once anyway,
    and only its last need be drawn."""
    return dict(self.options).get("mininterval", TICK_INTERVAL) == 0

  @property
  def tick_interval(self) -> float | None:
    """The seconds within which a tick may be dropped after the last one
    queued (``loops.events.tick``); None where the bar needs every tick
    (it draws each) or draws none."""
    if self.disabled or self.draws_every_tick:
      return None
    interval = THINNED_TICKS * float(dict(self.options).get("mininterval",
                                                            TICK_INTERVAL))
    if not interval > 0:  # (negative or NaN: tqdm then draws each update)
      return None
    # An infinite (or huge) mininterval keeps only the open and the close;
    # the handler counts in int64 nanoseconds.
    return min(interval, LONGEST_THINNING)

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
    # Each device's values of its latest tick (``set_postfix``'s).
    self.values: dict[Any, tuple] = {}
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
    values = _postfix.text(self.values, self.tqdm.format_num)
    if values:
      postfix.append(values)
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
          # The last values stay: those the loop stopped at.
          shown = getattr(self.tqdm, "postfix", None)
          self.tqdm.set_postfix_str(f"{shown}, stopped" if shown
                                    else "stopped", refresh=False)
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


class Bars(_loops.Listener):
  """Every progress bar of this process: the drawing listener of the loops'
  invocations (``loops.invocations.invocations``), one bar per invocation of
  a loop whose site has a ``BarSpec``, merged over the devices that run it.
  Its methods run under the registry's lock."""

  #: Bars kept findable after their invocation, for devices that open them
  #: late (the newest; older ones are forgotten, so that it stays flat over
  #: any number of invocations).
  KEPT_BARS = _loops.Invocations.KEPT

  def __init__(self):
    # (site, index) -> its bar; bars stay findable after closing, for
    # devices that open them late.
    self._bars: collections.OrderedDict = collections.OrderedDict()
    # An open invocation's handle -> the bar it draws (only those drawn).
    self._drawn: dict[int, _Bar] = {}

  def follows_every_tick(self, spec, handle) -> bool:
    # A bar that redraws at every tick (mininterval=0) draws each.
    del handle
    return getattr(spec, "draws_every_tick", False)

  def on_open(self, invocation) -> None:
    spec = invocation.spec
    if not isinstance(spec, BarSpec) or spec.disabled:
      return  # a loop no bar draws
    context = invocation.context
    if not (context is None or spec.all_processes
            or context.process_index == 0):
      return  # drawn by process 0 only
    bar = self._bars.get(invocation.group)
    if bar is None:
      bar = self._bars[invocation.group] = _Bar(spec, invocation.total)
      while len(self._bars) > self.KEPT_BARS:
        self._bars.popitem(last=False)
    if bar.is_open:
      bar.counts[invocation.device] = 0
      bar.expected.update(invocation.peers)
      self._drawn[invocation.handle] = bar

  def on_tick(self, invocation, count, lanes, running,
              values=None) -> None:
    bar = self._drawn.get(invocation.handle)
    if bar is None or not bar.is_open:
      return  # not drawn here, or already closed
    device = invocation.device
    bar.counts[device] = max(count, bar.counts[device])
    bar.lanes = lanes
    if running is not None:
      bar.running[device] = running
    if values is not None:
      bar.values[device] = values
    bar.show()

  def on_end(self, invocation, count, lanes, stopped, force) -> None:
    """The last of the bar's devices to end closes it (``force``: this one,
    the barrier's: a device that has not opened it by then never will)."""
    bar = self._drawn.pop(invocation.handle, None)
    if bar is None or not bar.is_open:
      return
    device = invocation.device
    if count is not None:  # its close's count
      bar.counts[device] = count
      bar.lanes = lanes
      bar.running.pop(device, None)
    bar.closed.add(device)
    # One device's loop stopped (its computation failed) stops the bar,
    # whichever device ends last.
    bar.stopped = bar.stopped or stopped
    devices = bar.devices()
    if force or bar.closed >= devices:
      bar.show(final=True)
      stopped = bar.stopped
      total = bar.tqdm.total
      if total is not None:  # a known length tells whether it finished
        stopped = stopped or min(
            bar.counts.get(d, 0) for d in devices) < total
      bar.finish(stopped=stopped)

  def on_stale(self, opened_before: float) -> None:
    # A bar still waiting for a device that never opened it (its
    # computation failed first) once every other device has ended.
    waiting = {id(bar) for bar in self._drawn.values()}
    each = RaiseAfterAll()
    for bar in list(self._bars.values()):
      if (bar.is_open and bar.opened < opened_before
          and id(bar) not in waiting):
        with each:
          try:
            bar.show(final=True)
          finally:
            bar.finish(stopped=True)
    each.raise_first()


bars = Bars()
_loops.invocations.listen(bars)
