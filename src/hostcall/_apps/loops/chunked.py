"""The device side of a chunked loop: one invocation, from its open to its
close, around the loop's chunks.

A progress loop and a steered loop are one thing on the device: the loop
opens an invocation (``events.open_bar``: the host's registry,
``invocations.py``, gives it a handle), runs as chunks of steps
(``chunks.chunked_scan``, or ``chunks.chunked_while``, whose chunk size the
host may pace), ticks after each chunk where something on the host follows the
ticks (a bar, a ``stop_when`` predicate), asks the stop check after each
chunk where it is steered (``stop``), and closes the invocation after its
last step. What the host does with the events is its listeners' (a bar
where the site has one, the steered loop's stop state where it has a
``stop``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

from hostcall._apps.loops import (chunks as _chunks, events as _events,
                                  steerer as _steerer,
                                  tick_values as _tick_values)
from hostcall._core import bind

#: The most steps a chunk or a bar counts (int32 on the device).
INT32_MAX = 2**31 - 1

_local = threading.local()


@contextlib.contextmanager
def nested():
  """Around the tracing of a chunked loop's body (or of a body ``track``
  decorates): loops traced inside it are one level deeper."""
  _local.depth = getattr(_local, "depth", 0) + 1
  try:
    yield
  finally:
    _local.depth -= 1


def depth() -> int:
  """How many chunked loops' bodies are being traced here (the row of a
  bar drawn for a loop traced now)."""
  return getattr(_local, "depth", 0)


#: Steps whose buffered taps reach the host in one flush, at most, in a loop
#: that is not steered (ticks stay every ``every`` steps): one flush costs
#: the host far more than a tick, so that a loop ticking often flushes
#: seldom (docs/performance.md, "Rows gathered, flushes spaced", has the
#: measurement).
FLUSH_STEPS = 256


def scan_loop(site: int, stop, ticks: bool, f: Callable, init, xs, length,
              reverse, unroll, every: int, steps: int, *,
              values: bool = False) -> Any:
  """``lax.scan`` of ``f`` (a ``(carry, x) -> (carry, y)`` body) as one
  invocation of ``site``, of ``steps`` steps (``chunks.scan_length``'s), in
  chunks of ``every``: ``ticks`` after each chunk, ``stop`` (a
  ``control.Stop``, or None) checked after each; ``values``: the ticks take
  the values the body sets (``tick_values``: a bar's postfix). Returns
  ``(carry, ys)``, or a ``control.Result`` of it where steered."""
  handle, count = _events.open_bar(site, steps, stop)
  slots = _tick_values.Slots(keep=ticks)

  def attempt():
    def body(state, x):
      count, carry, carried = state
      with nested(), _body_values(values, slots, carried) as step:
        carry, y = f(carry, x)
      return (count + 1, carry, step.values), y

    return _chunks.chunked_scan(
        body, (count, init, slots.initial()), xs, length=length,
        reverse=reverse, unroll=unroll, every=every,
        after_chunk=None if not ticks else
        lambda state, ys: _events.tick(site, handle, state[0], (state, ys),
                                       postfix=(slots.layout, state[2]),
                                       every_tick=_follows_ticks(stop)),
        check=None if stop is None else
        lambda state, index: _steerer.steerer().check(handle, index, state),
        flush_steps=FLUSH_STEPS)

  out = slots.run(attempt)
  (count, carry, carried), ys = out[:2]
  return _ended(site, handle, stop, count, (carry, ys),
                None if stop is None else out[2], (slots.layout, carried))


#: Why the body of a loop no bar draws takes no values.
NO_BAR = "its loop draws no bar (a hostcall.control loop)"


@contextlib.contextmanager
def _body_values(values: bool, slots, carried):
  """Around one trace of a loop's body: the ``tick_values`` step of its
  ``slots`` where its ticks take values, else a frame refusing them."""
  if not values:
    with _tick_values.refused(NO_BAR):
      yield _tick_values.Step(carried)
    return
  with slots.step(carried) as step:
    yield step


def while_loop(site: int, stop, ticks: bool, cond_fun: Callable,
               body_fun: Callable, init_val, total, every: int | None, *,
               values: bool = False) -> Any:
  """``lax.while_loop`` as one invocation of ``site`` (``total``: its
  steps where known, else -1), in chunks of ``every`` steps (None: as many
  as the host paces); ``ticks``, ``stop`` and ``values`` as for
  ``scan_loop``. Returns the carry, or a ``control.Result`` of it where
  steered."""
  handle, count = _events.open_bar(site, total, stop)
  if every is None:
    pace = _events.Pace(site, steered=stop is not None)

    def steps():
      return bind([handle], target=pace, kind="call",
                   result_avals=(_events.INT_AVAL,), ordering="unordered")[0]
  else:
    # A chunk counts its steps in int32: a larger ``every`` means one
    # chunk, as long as any loop the step count can follow.
    steps = min(every, INT32_MAX)
  slots = _tick_values.Slots(keep=ticks)

  def attempt():
    # The carry with the values the body set, which the ticks send.
    def body(state):
      carry, carried = state
      with nested(), _body_values(values, slots, carried) as step:
        carry = body_fun(carry)
      return carry, step.values

    def cond(state):
      return cond_fun(state[0])

    return _chunks.chunked_while(
        cond, body, (init_val, slots.initial()), count, steps=steps,
        after_chunk=None if not ticks else
        lambda count, state: _events.tick(
            site, handle, count, state, cond_fun(state[0]),
            postfix=(slots.layout, state[1]),
            every_tick=_follows_ticks(stop)),
        check=None if stop is None else
        lambda state, index: _steerer.steerer().check(handle, index, state))

  count, (carry, carried), reason = slots.run(attempt)
  return _ended(site, handle, stop, count, carry,
                None if stop is None else reason, (slots.layout, carried))


def _follows_ticks(stop) -> bool:
  """Whether the host side of a loop steered by ``stop`` follows every
  tick: a ``stop_when`` predicate sees each (the checks wait for it); a
  time limit and Ctrl-C are the stop state's own, which no tick feeds, so
  such a loop's ticks are a bar's, thinned as any bar's."""
  return stop is not None and stop.stop_when is not None


def _ended(site, handle, stop, count, value, reason, postfix):
  """The loop's end: a steered loop's finish (which raises a failure it
  contained), the invocation's close (with ``postfix``, the values of the
  last step); what the loop returns."""
  if stop is not None:
    _events.finish(site, handle, reason)
  _events.close_bar(site, handle, count, value, reason, postfix)
  if stop is None:
    return value
  return _steerer.steerer().result(value, reason != 0, count, reason)
