"""A progress bar's events on the device side: the host calls a wrapped
loop makes, and the targets that deliver them to the loops' registry
(``invocations.py``), which tells its listeners (``progress/bars.py``'s
bars, ``control``'s host side).

A loop sends *open* before its first step (a call: it returns the
invocation's handle, which the loop's other events carry), a *tick* with the
step count after each chunk of steps and *close* after its last step (both
asynchronous taps: the device copies a few numbers into hostcall's queue and
goes on). A ``while_loop`` asks *pace* how many steps to run before its next
tick; a steered loop sends *finish* when it stops; a body decorated by
``track`` sends one *step* a step.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hostcall import _jax_private
from hostcall._apps.loops import invocations as _loops, steerer as _steerer
from hostcall._apps.loops.waiting_operand import data_leaves, waiting_operand
from hostcall._core import CallTarget, PostponingTarget, bind, target
from hostcall._core.targets import Schedule
from hostcall._core.context import delivering_asynchronously
from hostcall._runtime import enqueue as _enqueue

# Targets ---------------------------------------------------------------------


class _BarEvent:
  """A bar's event at one loop (``site``): it happens once, rematerialised or
  not; under vmap it sees every lane at once; step counts have nothing to
  differentiate."""

  remat = "once"
  #: One of a chunked loop's own events (``loop_event``: ``deferrable``
  #: tells them from the calls a loop's body makes).
  schedule = Schedule(loop_event=True)

  def __repr__(self):
    return f"progress.{type(self).__name__.lstrip('_').lower()}({self.site})"


@target
class _BarQuestion(_BarEvent, CallTarget):
  """An event whose answer the loop waits for (its failure fails the
  loop's computation)."""

  site: int
  schedule = Schedule(when="live", live_without_effect=True, loop_event=True)

  def vmap_method(self) -> str:
    return "broadcast_all"

  def check_differentiable(self) -> None:
    return None


@target
class _BarTap(_BarEvent, PostponingTarget):
  """An event the loop does not wait for (failures wait for the barrier)."""

  site: int


def _handle(value) -> int:
  """The invocation handle an event carries (the same in every lane);
  ``LATEST`` where it has no lane (a vmap of none)."""
  return _first(value, LATEST)


def _first(value, default: int) -> int:
  """The number every lane of ``value`` holds, or ``default`` where it has
  no lane."""
  value = np.asarray(value)
  return int(value.flat[0]) if value.size else default


#: The handle a queued open gives its loop (``_Open.schedule.answer``).
LATEST = -1

#: The schedules of the events queued by hostcall.jit (a bar's open among
#: them, answering LATEST), and of a bar's pace (a steered loop's runs live
#: without an effect: ``Pace.steered``).
_QUEUED_EVENT = Schedule(when="queued", loop_event=True)
_QUEUED_OPEN = Schedule(when="queued", answer=LATEST, loop_event=True)
_LIVE_PACE = Schedule(when="live", loop_event=True)


def _resolved(handle, site: int, context) -> int:
  """The handle an event of ``site`` carries; for ``LATEST``, the one this
  device's latest open of the site got (queued, the open came first)."""
  handle = _handle(handle)
  if handle == LATEST:
    return _loops.invocations.latest(site, context.device)
  return handle


@target
class _Open(_BarQuestion):
  """Opens the bar of one invocation: ``(total,)``; returns the invocation's
  handle, which the loop's other events carry (the loop cannot start before
  its open, and a bar never mixes two invocations)."""

  stop: Any = None  # a hostcall.control Stop: a steered loop
  containable = False  # opens a loop even where a failure is contained

  # Queued by hostcall.jit (a bar, not a steered loop, whose checks need
  # the handle): the loop gets the handle its device makes
  # (``Schedule.answer``), or LATEST, where the ticks and the close find
  # the handle the open got, the queue keeping them in order.
  @property
  def schedule(self) -> Schedule:
    if self.stop is None:
      return _QUEUED_OPEN
    return _BarQuestion.schedule

  def deliver(self, flat_args, context):
    handle = self._open(flat_args, context)
    lanes = tuple(size for _, size in reversed(context.batch_levels))
    return [np.full(lanes, handle, np.int32)]

  def caller(self, context):
    # Queued (hostcall.jit's open): no result to make, its loop holding
    # the handle its device made.
    return lambda *flat_args: self._open(flat_args, context)

  def _open(self, flat_args, context) -> int:
    total = _first(flat_args[0], -1)
    # Queued by hostcall.jit, the handle its device made, when and on which
    # thread (LATEST where it made none): invocations that run at once are
    # told apart, and a failing computation ends only its own.
    given, opened, thread = (_enqueue.made_at(flat_args[1])
                             if len(flat_args) > 1 else (LATEST, None, None))
    # A steered loop's host side hears of it from the registry, its stop
    # carried by the invocation.
    return _loops.invocations.open(
        self.site, context.device, None if total < 0 else total, context,
        queued=delivering_asynchronously(), stop=self.stop,
        handle=None if given == LATEST else given, opened=opened,
        thread=thread)


@target
class _Close(_BarTap):
  """Closes an invocation's bar when its loop ends:
  ``(handle, count, waiting operand, *values[, reason])``; ``postfix`` as for a
  tick (the values of the last step: XLA may run the close before the
  loop's last tick, where nothing the loop computes keeps it after)."""

  postfix: tuple = ()
  schedule = _QUEUED_EVENT

  def deliver(self, flat_args, context):
    handle, count, _, *rest = flat_args
    values, reason = _split(self.postfix, rest)
    handle = _resolved(handle, self.site, context)
    # A steered loop's reason: not 0 where it stopped early (all lanes
    # stop together).
    stopped = bool(reason) and bool(np.any(np.asarray(reason[0]) != 0))
    options = {} if values is None else {"values": values}
    _loops.invocations.close(handle, context.device,
                             _loops.last_count(count),
                             _loops.lanes_of(context), stopped=stopped,
                             **options)
    return ()


@target
class _Tick(_BarTap):
  """The step count after a chunk: ``(handle, count, waiting operand, *values[,
  running])``; ``postfix``: the layout of the values the loop's body set
  (``tick_values.layout_of``), one operand each that is not a text;
  ``thin_interval``: where ticks may be thinned (``tick``)."""

  postfix: tuple = ()
  thin_interval: float | None = None
  schedule = _QUEUED_EVENT

  def deliver(self, flat_args, context):
    handle, count, _, *rest = flat_args
    values, active = _split(self.postfix, rest)
    running = int(np.count_nonzero(active[0])) if active else None
    self._tick(_resolved(handle, self.site, context),
               _loops.last_count(count), running, context, values)
    return ()

  # The queue hands a run of consecutive ticks over at once. A bar shows
  # the furthest count, and the run's ticks reach the host at the same
  # moment (tqdm would draw at most one of them), so that only the last
  # tick of each invocation in a row is drawn: a short loop's hundred
  # ticks cost one draw. A steered loop's predicate still sees every tick,
  # and a bar that redraws at every tick (mininterval=0) draws each.
  joins_calls = True

  def deliver_steps(self, stacked, steps, context):
    handles, counts, _, *rest = (
        _per_call(a, steps, context) for a in stacked)
    values, active = _split(self.postfix, rest)
    handles = (handles[:, 0] if handles.shape[1]
               else np.full(steps, LATEST, np.int64))
    counts = (counts.max(axis=1) if counts.shape[1]
              else np.zeros(steps, np.int64))
    running = np.count_nonzero(active[0], axis=1) if active else None
    found = {}  # a handle carried -> (the invocation's, each tick)
    failure = None
    handles, counts = handles.tolist(), counts.tolist()
    running = None if running is None else running.tolist()
    for i, handle in enumerate(handles):
      if handle not in found:
        invocation = _resolved(handle, self.site, context)
        found[handle] = invocation, (
            _loops.invocations.follows_every_tick(self.site, invocation))
      invocation, every_tick = found[handle]
      if every_tick or i + 1 == steps or handles[i + 1] != handle:
        try:
          self._tick(invocation, counts[i],
                     None if running is None else running[i], context,
                     _row(values, i))
        except BaseException as exc:  # noqa: BLE001 - raised after the rest
          # Each tick fails alone: the later ones still reach their
          # steered loop's checks, which wait for them.
          failure = failure or exc
    if failure is not None:
      raise failure

  def _tick(self, handle: int, count: int, running, context,
            values) -> None:
    lanes = _loops.lanes_of(context)
    if values is None:
      _loops.invocations.tick(handle, context.device, count, lanes, running)
    else:
      _loops.invocations.tick(handle, context.device, count, lanes, running,
                              values=values)


def _split(postfix: tuple, operands: list) -> tuple:
  """A tick's values (``((key, text or array), ...)``, None where its body
  set none) and its other operands, from the operands after its waiting
  operand."""
  if not postfix:
    return None, operands
  arrays = iter(operands)
  values = tuple((key, next(arrays) if text is None else text)
                 for key, text in postfix)
  return values, list(arrays)


def _row(values, i: int):
  """The values of the ``i``-th of a run of ticks (``_per_call``'s rows)."""
  if values is None:
    return None
  return tuple((key, value if isinstance(value, str) else value[i])
               for key, value in values)


def _per_call(column, calls: int, context) -> np.ndarray:
  """A stacked column (the calls' axis after the batch axes) as one row a
  call: ``(calls, lanes * values)``."""
  column = np.asarray(column)
  rank = len(context.batch_levels) if context else 0
  if rank:
    column = np.moveaxis(column, rank, 0)
  return column.reshape(calls, -1)


@target
class Step(_BarTap):
  """One step of a decorated body (``track``): ``(lanes probe, *values)``;
  ``postfix`` as for a tick."""

  postfix: tuple = ()
  schedule = Schedule(loop_event=True, delivery="async")

  def deliver(self, flat_args, context):
    self._step(1, _split(self.postfix, flat_args[1:])[0], context)
    return ()

  def deliver_steps(self, stacked, steps, context):
    # The chunk's steps at once (buffered in a hostcall.scan): the bar
    # shows the values of its last.
    values = _split(self.postfix, [
        _per_call(a, steps, context) for a in stacked[1:]])[0]
    self._step(steps, _row(values, steps - 1), context)

  def _step(self, steps: int, values, context) -> None:
    lanes = _loops.lanes_of(context)
    if values is None:
      _loops.invocations.step(self.site, context.device, steps, lanes,
                              context)
    else:
      _loops.invocations.step(self.site, context.device, steps, lanes,
                              context, values=values)


@target
class Pace(_BarQuestion):
  """A while_loop's question: how many steps until the next tick?"""

  #: A steered loop's (whose open runs live, so that the pace finds its
  #: handle); a bar's alone is asked as ``jax.jit`` asks it: its queued
  #: open has not reached the host when a live pace would.
  steered: bool = False

  # Answered where a failure is contained too: a chunk of no steps would
  # keep the failing device from its next check.
  containable = False

  @property
  def schedule(self) -> Schedule:
    return _BarQuestion.schedule if self.steered else _LIVE_PACE

  def deliver(self, flat_args, context):
    steps = _loops.invocations.pace(
        _resolved(flat_args[0], self.site, context), context.device)
    lanes = tuple(size for _, size in reversed(context.batch_levels))
    return [np.full(lanes, steps, np.int32)]


@target
class _Finish(_BarQuestion):
  """A steered loop has stopped on this device: ``(handle, reason)``;
  raises the failure its loop contained, if any."""

  containable = False  # raises what was contained
  schedule = Schedule(when="live", live_without_effect=True, loop_event=True,
                      asks_first=True)

  def ask_first(self, handle, reason):
    # Under hostcall.jit the device ends the loop itself; the host runs
    # this only to raise a failure (a JAX callback costs the device about
    # 0.1 ms, the native end a microsecond). Under vmap every lane carries
    # the handle, and stopped for the same reason (the highest: asked).
    handle, reason = jnp.ravel(handle), jnp.ravel(reason)
    if not handle.size or not reason.size:
      return jnp.int32(1)  # no lane: the host's finish says what to do
    return _steerer.steerer().finish_here(handle[0], jnp.max(reason))

  def deliver(self, flat_args, context):
    handle, reason = flat_args
    _loops.invocations.finish(_resolved(handle, self.site, context),
                              _first(reason, 0))
    return ()


# Device side -----------------------------------------------------------------


def lanes_probe(tree) -> jax.Array:
  """A zero-size array batched wherever ``tree`` is: it makes a tick see
  the vmap lanes without sending any data."""
  probe = jnp.zeros((0,), jnp.int8)
  for leaf in data_leaves(tree):
    probe = probe + jnp.ravel(leaf)[:0].astype(jnp.int8)
  return probe


INT_AVAL = _jax_private.ShapedArray((), jnp.int32)


# The bar's events are asynchronous taps: the device copies a few numbers
# into the queue and goes on; the consumer thread draws. They are unordered
# for JAX: data dependencies order them (open -> loop -> close), and the
# queue keeps the order in which the device sent them.


def open_bar(site, total, stop=None) -> tuple[jax.Array, jax.Array]:
  """The invocation's handle, and the loop's initial step count, which
  waits for it."""
  (handle,) = bind([jnp.asarray(total, jnp.int32)], target=_Open(site, stop),
                   kind="call", result_avals=(INT_AVAL,),
                   ordering="unordered")
  return handle, jnp.zeros_like(handle)


def _witness(tree) -> jax.Array:
  """One number read from every leaf of ``tree`` (or an empty array when it
  holds no data), batched wherever ``tree`` is."""
  value = waiting_operand(tree)
  return value if value.size else lanes_probe(tree).astype(jnp.float32)


def tick(site, handle, count, results, *active, postfix=((), ()),
         every_tick: bool = True):
  """The tick after a chunk; ``postfix``: ``(layout, values)``, the values
  the loop's body set (``tick_values``: a layout and the traced values,
  which ride on the tick); ``every_tick``: the loop's host side follows
  every tick (a ``stop_when`` predicate: ``chunked._follows_ticks``), so
  that none may be thinned."""
  layout, values = postfix
  # Reading the chunk's results keeps the tick after the chunk's steps.
  bind([handle, count, _witness(results), *values, *active],
       target=_Tick(site, layout, None if every_tick else _thinned(site)),
       kind="call", delivery="async", ordering="unordered")


def _thinned(site) -> float | None:
  """The seconds within which ``hostcall.jit``'s native queue may drop a
  tick of ``site`` after the last one it queued (``HostTarget.thin_interval``),
  or None where every tick must reach the host: what the site's bar asks
  (``tick_interval``; a loop no bar draws asks none). Only a loop without a
  ``stop_when``, which sees every tick.

  The queue thins a tick by its site alone (one device's), whatever its
  invocation: a tick of one invocation may be dropped within the interval
  after the last queued tick of the one before it, or of another thread's
  running at once. That drops nothing a bar shows: each
  invocation's open draws its first state and its close, which carries
  the count and the values of its last step, its last; and such a tick
  comes less than the interval (a fraction of ``mininterval``) after its
  own invocation's open, when tqdm would not redraw anyway."""
  return getattr(_loops.invocations.spec(site), "tick_interval", None)


def ticks(stop, tqdm_options) -> bool:
  """Whether a loop's chunks tick: not when no bar is drawn (``disable``)
  and no host predicate reads them."""
  return not (tqdm_options.get("disable") is True
              and (stop is None or stop.stop_when is None))


def close_bar(site, handle, count, results, reason=None,
              postfix=((), ())):
  """Closes the bar when the loop ends; ``reason``: a steered loop's (not 0
  where it stopped early: the bar is marked ``stopped``); ``postfix``: as
  for ``tick``, the values of the loop's last step."""
  # The runtime starts an operation when its input buffers are ready, and
  # XLA may know a loop's final step count without running it (an induction
  # variable): reading the loop's results makes the close wait for its end.
  layout, values = postfix
  operands = [handle, count, _witness(results), *values]
  if reason is not None:
    operands.append(reason)
  bind(operands, target=_Close(site, layout), kind="call", delivery="async",
       ordering="unordered")


def finish(site, handle, reason) -> None:
  # Synchronous, on every device (one call per device in a global view
  # too, and no result to share): a failure contained in the loop fails
  # its computation on each device at this point, so that none waits for
  # another in a collective.
  bind([handle, reason], target=_Finish(site), kind="call",
       ordering="unordered", delivery="sync", partitioned=True)

