"""Loop-buffered delivery: the taps of K loop steps reach the host in one trip.

``hostcall.scan`` runs the loop as chunks of K steps, an inner ``lax.scan``
each, and traces its body with a ``Collector`` active. A tap bound directly
in the body (not inside a cond, while or vmap of the body) is not staged as a
host call: its values become extra outputs of the inner scan, stacked K deep,
and after each chunk (and the shorter last one) one host call delivers them.
On the host, ``FlushTarget`` replays the taps one by one, step by step, in
program order, to their own host functions.

The device pays one host call per K steps; the buffers hold K times one
step's tap payload.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jex_core

from hostcall import _jax_private
from hostcall._core import errors, host

_local = threading.local()
logger = logging.getLogger("hostcall")


class Collector:
  """The taps bound at the top level of one trace of a loop body: each
  ``(target, values, delivery)``."""

  def __init__(self, trace):
    self.trace = trace
    self.taps: list[tuple[host.HostTarget, list, str]] = []

  def owns(self, flat_args) -> bool:
    # Only a tap bound by the body's own trace: not one inside a cond,
    # while or vmap in the body, even when it closes over body values.
    with jex_core.take_current_trace() as current:
      if current is not self.trace:
        return False
    # Its operands are the body's values or constants.
    return all(_jax_private.trace_of(a) in (self.trace, None)
               for a in flat_args)

  def signature(self) -> list:
    return [(target, [jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v))
                      for v in values], delivery)
            for target, values, delivery in self.taps]


def intercept(flat_args, target: host.HostTarget, delivery: str) -> bool:
  """Records a result-less tap (delivered as ``delivery`` asks) in the
  active collector; True if recorded."""
  collector = getattr(_local, "collector", None)
  if (collector is None or not target.bufferable
      or not collector.owns(flat_args)):
    return False
  collector.taps.append((target, list(flat_args), delivery))
  return True


@contextlib.contextmanager
def collecting():
  with jex_core.take_current_trace() as trace:
    collector = Collector(trace)
  previous = getattr(_local, "collector", None)
  _local.collector = collector
  try:
    yield collector
  finally:
    _local.collector = previous


class FlushTarget(host.HostTarget):
  """Replays K steps of buffered taps, in order, to their host functions."""

  returns_results = False
  bufferable = False  # an enclosing hostcall.scan flushes its own chunks

  def __init__(self, taps: list, every: int):
    deliveries = tuple(d for _, _, d in taps)
    super().__init__(("flush", tuple(t for t, _, _ in taps),
                      tuple(len(s) for _, s, _ in taps), deliveries, every))
    self.targets = [t for t, _, _ in taps]
    self.sizes = [len(s) for _, s, _ in taps]
    # The chunk goes asynchronously when every tap in it asked to.
    self.delivery = ("async" if all(d == "async" for d in deliveries)
                     else "sync")
    self._cache: dict = {}

  def __repr__(self):
    return f"buffered_taps({self.targets!r})"

  def vmap_method(self) -> str:
    return "broadcast_all"  # every batch axis in front of the K axis

  def check_differentiable(self) -> None:
    return None  # no results: nothing to differentiate

  def _contexts(self, context: host.CallContext) -> list:
    key = (context.batch_levels, context.device)
    contexts = self._cache.get(key)
    if contexts is None:
      contexts = self._cache[key] = [host.make_context(tuple(
          ("batch", (0,) * size, axis_size)
          for _, axis_size in context.batch_levels), context.device)
          for size in self.sizes]
    return contexts

  def deliver(self, flat_args, context: host.CallContext):
    *buffers, count = flat_args
    lead = (slice(None),) * len(context.batch_levels)
    n = int(np.asarray(count).reshape(-1)[0])
    taps, vectorised = [], []
    offset = 0
    for target, size, tap_context in zip(self.targets, self.sizes,
                                         self._contexts(context)):
      tap = (target, buffers[offset:offset + size], tap_context)
      (taps if target.deliver_steps is None else vectorised).append(tap)
      offset += size
    # The hot loop of loop-buffered delivery: one host function call per tap
    # per step, as host.run would make it, without its per-call set-up.
    # Ctrl-C or sys.exit() in a tap stops a computation that waits for the
    # chunk; one that does not wait (asynchronous delivery) has gone on, and
    # the chunk's other taps are delivered as a plain loop's would be.
    stops = () if host.delivering_asynchronously() else (KeyboardInterrupt,
                                                           SystemExit)
    outer = host.call_context()
    try:
      for step in range(n):
        index = lead + (step, Ellipsis)
        for target, tap_buffers, tap_context in taps:
          host._current.context = tap_context
          try:
            target.deliver([b[index] for b in tap_buffers], tap_context)
          except stops:
            raise
          except BaseException:  # noqa: BLE001 - later taps still run
            _failed(target)
      # Vectorised taps take the chunk in one call, after the others.
      steps = lead + (slice(0, n), Ellipsis)
      for target, tap_buffers, tap_context in vectorised:
        host._current.context = tap_context
        try:
          target.deliver_steps([b[steps] for b in tap_buffers], n,
                               tap_context)
        except stops:
          raise
        except BaseException:  # noqa: BLE001 - later taps still run
          _failed(target)
    finally:
      host._current.context = outer
    return ()


def _failed(target) -> None:
  """Reports the exception being handled, for the next barrier."""
  exc = sys.exc_info()[1]
  formatted = errors.format_safely(exc)
  logger.error("hostcall: buffered tap %r raised\n%s", target, formatted)
  host.errors.record(exc, formatted)


def step_output(out) -> tuple:
  """A scan body's ``(carry, y)``, or ``lax.scan``'s error and the fix."""
  if isinstance(out, (tuple, list)) and len(out) == 2:
    return tuple(out)
  leaves = jax.tree_util.tree_leaves(out)
  if len(leaves) == 1 and hasattr(leaves[0], "shape"):
    got = f"{jnp.result_type(leaves[0])}{list(jnp.shape(leaves[0]))}"
  else:
    got = f"{type(out).__name__} {jax.tree_util.tree_structure(out)}"
  raise TypeError(
      f"scan body output must be a pair, got {got}: the body returns "
      "(carry, y), y being what the step adds to the stacked outputs (None "
      "for nothing), as for jax.lax.scan.")


def scan_length(xs, length: int | None, who: str) -> int:
  """The number of steps of a scan over ``xs`` (or of ``length``)."""
  leaves = jax.tree_util.tree_leaves(xs)
  steps = length if length is not None else (
      leaves[0].shape[0] if leaves else None)
  if steps is None:
    raise ValueError(f"{who} needs xs or length to know its number of steps, "
                     "as jax.lax.scan does.")
  return int(steps)


def scan(f: Callable, init, xs=None, length: int | None = None,
         reverse: bool = False, unroll: int | bool = 1, *,
         every: int = 64, after_chunk: Callable | None = None) -> Any:
  """``lax.scan`` whose taps reach the host ``every`` steps at a time.

  Arguments:
    f, init, xs, length, reverse, unroll: as for ``jax.lax.scan``.
    every: how many steps of taps the device gathers before one host call.
      The device holds ``every`` times one step's tap payload.
    after_chunk: hostcall's applications' hook: called (traced) as
      ``after_chunk(carry, ys_of_chunk)`` after each chunk's flush.

  Returns:
    What ``jax.lax.scan`` returns.

  Taps bound directly in ``f`` (``id_tap``, ``id_print``, result-less
  ``io_callback``/``debug_callback``) are buffered; taps under a
  transformation or control flow inside ``f`` run as usual (so they may
  reach the host before buffered taps of earlier steps). Every buffered tap
  is still delivered once per step, in program order, before the loop's
  computation ends (or, with asynchronous delivery, through the queue).

  Example:
    >>> import jax, hostcall
    >>> from hostcall import host_callback as hcb
    >>> def step(c, _):
    ...   hcb.id_print(c, what="c")
    ...   return c + 1, None
    >>> _ = jax.jit(lambda: hostcall.scan(step, 0, length=2, every=8))()
    what: c
    0
    what: c
    1
  """
  if not isinstance(every, int) or isinstance(every, bool) or every < 1:
    raise ValueError(f"every must be a positive int, got {every!r}")
  steps = scan_length(xs, length, "hostcall.scan")
  if steps == 0:  # no step, no tap: lax.scan gives the empty outputs
    return lax.scan(f, init, xs, length=0)
  if reverse:
    flip = lambda t: jax.tree_util.tree_map(lambda a: jnp.flip(a, 0), t)
    carry, ys = scan(f, init, flip(xs), length=length, unroll=unroll,
                     every=every, after_chunk=after_chunk)
    return carry, flip(ys)

  from hostcall._core.primitive import bind  # the primitive imports us
  targets = []

  def body(carry, x):
    # Taps of one step become extra outputs, stacked by the inner scan.
    with collecting() as collector:
      carry, y = step_output(f(carry, x))
    targets[:] = [FlushTarget(collector.signature(), every)]
    return carry, (y, [v for _, vals, _ in collector.taps for v in vals])

  def run(carry, xs_part, n):
    carry, (ys, taps) = lax.scan(body, carry, xs_part, length=n,
                                 unroll=unroll)
    if taps:
      bind(list(taps) + [jnp.int32(n)], target=targets[0], identity=False,
           delivery=targets[0].delivery)
    if after_chunk is not None:
      after_chunk(carry, ys)
    return carry, ys

  full, rest = divmod(steps, every)
  split = lambda t, lo, hi: jax.tree_util.tree_map(lambda a: a[lo:hi], t)
  carry, ys_parts = init, []
  if full:
    chunked = jax.tree_util.tree_map(
        lambda a: a[:full * every].reshape(full, every, *a.shape[1:]), xs)
    carry, ys = lax.scan(lambda c, x: run(c, x, every), carry,
                         chunked if xs is not None else None, length=full)
    ys_parts.append(jax.tree_util.tree_map(
        lambda a: a.reshape(full * every, *a.shape[2:]), ys))
  if rest:
    carry, ys = run(carry, split(xs, full * every, steps)
                    if xs is not None else None, rest)
    ys_parts.append(ys)
  ys = jax.tree_util.tree_map(lambda *p: jnp.concatenate(p), *ys_parts) \
      if len(ys_parts) > 1 else ys_parts[0]
  return carry, ys
