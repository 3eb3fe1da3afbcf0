"""Buffering: the taps of K loop steps reach the host in one trip.

A chunked loop (``chunks.chunked_scan``, hence ``hostcall.scan``) runs as
chunks of K steps, an inner ``lax.scan`` each, and traces its body with a
``Collector`` active (see ``hostcall._core.collecting``). A tap bound
directly in the body (not inside a cond, while or vmap of the body) is not
staged as a host call: its values become extra outputs of the inner scan,
stacked K deep, and after each chunk (and the shorter last one) one host
call delivers them. On the host, ``FlushTarget`` replays the taps one by
one, step by step, in program order, to their own host functions. A body
whose other host calls could see that move (``may_buffer``) is not
buffered: its calls run where written.

The device pays one host call per K steps; the buffers hold K times one
step's tap payload.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import numpy as np

from hostcall import _jax_private
from hostcall._apps.loops import tick_values
from hostcall._runtime import calls
from hostcall._core.effects import ORDERED
from hostcall._core.context import CallContext, make_context, swap_call_context
from hostcall._core.targets import (PostponingTarget, Schedule, Steps,
                                   target)


@target
class FlushTarget(PostponingTarget):
  """Replays K steps of buffered taps, in order, to their host functions.

  Attributes:
    targets: the buffered taps' targets, in program order.
    sizes: how many flat operands each of them has.
    deliveries: the delivery each asked for.
  """

  targets: tuple
  sizes: tuple
  deliveries: tuple
  _contexts_cache: dict = dataclasses.field(default_factory=dict,
                                            compare=False)


  @classmethod
  def of(cls, signature: list) -> "FlushTarget":
    """The flush of a collector's ``signature()``."""
    return cls(tuple(t for t, _, _ in signature),
               tuple(len(s) for _, s, _ in signature),
               tuple(d for _, _, d in signature))

  @property
  def schedule(self) -> Schedule:
    # An enclosing hostcall.scan does not gather it (it flushes its own
    # chunks), and hostcall.jit may defer it (its taps are all
    # bufferable); the chunk goes asynchronously when every tap in it
    # asked to.
    return Schedule(when="deferred", delivery=(
        "async" if all(d == "async" for d in self.deliveries) else "sync"))

  def __repr__(self):
    return f"buffered_taps({list(self.targets)!r})"

  def _contexts(self, context: CallContext) -> list:
    key = (context.batch_levels, context.device)
    contexts = self._contexts_cache.get(key)
    if contexts is None:
      contexts = self._contexts_cache[key] = [make_context(tuple(
          ("batch", (0,) * size, axis_size)
          for _, axis_size in context.batch_levels), context.device)
          for size in self.sizes]
    return contexts

  def deliver(self, flat_args, context: CallContext):
    *buffers, count = flat_args
    lead = (slice(None),) * len(context.batch_levels)
    # (Under a vmap of no lane the count has none: the buffers say it.)
    n = (int(np.asarray(count).reshape(-1)[0]) if np.size(count)
         else np.shape(buffers[0])[len(context.batch_levels)])
    every, offset = [], 0
    for tap_target, size, tap_context in zip(self.targets, self.sizes,
                                             self._contexts(context)):
      every.append((tap_target, buffers[offset:offset + size], tap_context))
      offset += size
    vectorised = [t for t in every if t[0].deliver_steps is not None]
    if len(vectorised) > 1:
      # Several vectorised taps (two Run.log calls a step) may share what
      # each call changes (a run's next step): step by step, in program
      # order, as the loop made them.
      taps, vectorised = every, []
    else:
      taps = [t for t in every if t[0].deliver_steps is None]
    # One host function call per tap per step, each under its own failure
    # policy (calls.deliver), as if the loop had called it there: a tap's
    # failure is postponed and the chunk goes on; a call that fails its
    # computation (debug and io callbacks, Ctrl-C) stops the chunk at that
    # step, so no later step's host call runs, as in lax.scan.
    outer = swap_call_context(None)
    try:
      for step in range(n if taps else 0):
        index = lead + (step, Ellipsis)
        for tap_target, tap_buffers, tap_context in taps:
          swap_call_context(tap_context)
          calls.deliver(tap_target, [b[index] for b in tap_buffers],
                        tap_context)
      # Vectorised taps take the chunk in one call, after the others.
      steps = lead + (slice(0, n), Ellipsis)
      for tap_target, tap_buffers, tap_context in vectorised:
        swap_call_context(tap_context)
        calls.deliver(Steps(tap_target, n),
                      [b[steps] for b in tap_buffers], tap_context)
    finally:
      swap_call_context(outer)
    return ()


#: The most bytes of tap values a flush of several chunks holds on the device
#: (see ``chunked_scan``'s ``flush_steps``), a vmap lane's: tracing cannot
#: tell how many lanes a batching of the loop will have, so that the bound
#: is small.
FLUSH_BYTES = 64 << 10


def probe(body: Callable, init, xs):
  """``body`` traced for one step (its closed jaxpr), or None where that
  trace fails (the loop's own trace then says why)."""
  x = (None if xs is None else
       jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(
           a.shape[1:], a.dtype), xs))
  try:
    return jax.make_jaxpr(body)(init, x)
  except tick_values.Retrace:
    raise  # the loop is traced again, with room for its body's values
  except Exception:  # noqa: BLE001 - the loop's own trace says what fails
    return None


def may_buffer(probe, orderings: list) -> bool:
  """Whether a body's collected taps may be delivered after its chunk.

  Buffering moves a tap past everything else the loop does on the host, so
  it is done only where nothing can see the move: the body (traced with its
  taps collected) makes no other host call with an effect (a live call with
  results, a call inside a ``cond`` or ``while`` of the body, JAX's own
  callbacks), and its taps thread at most one ordering's token, which the
  flush then threads. Otherwise every call runs where it was written, as in
  ``lax.scan``: the order of ordered calls, and the step a failure stops
  the loop at, are ``lax.scan``'s.
  """
  live = [e for e in probe.effects
          if not isinstance(e, _jax_private.NOT_REALLY_EFFECTS)]
  return not live and len({o for o in orderings if o in ORDERED}) <= 1


def chunks_a_flush(probe, tap_count: int, every: int, flush_steps: int):
  """How many chunks of ``every`` steps one flush takes (None: one):
  ``flush_steps`` steps at most, and ``FLUSH_BYTES`` of the values a step's
  taps buffer (known from ``probe``, one step's trace, whose last
  ``tap_count`` outputs they are)."""
  if probe is None or not tap_count:
    return None
  taps = probe.out_avals[-tap_count:]
  step_bytes = sum(math.prod(t.shape) * getattr(t.dtype, "itemsize", 8)
                   for t in taps)
  count = step_bytes and min(flush_steps // every,
                             FLUSH_BYTES // (step_bytes * every))
  return count if count > 1 else None

