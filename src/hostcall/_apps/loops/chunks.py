"""A loop run as chunks of steps, with the hooks of hostcall's chunked
loops (``chunked.py``: progress bars, steered loops): ``chunked_scan`` (a
``lax.scan`` whose chunks flush their buffered taps, ``buffering.py``) and
``chunked_while``; and the checks of their arguments."""

from __future__ import annotations

import math
import sys
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import lax

from hostcall import _jax_private
from hostcall._apps.loops import buffering as _buffering
from hostcall._core.checks import check_callable
from hostcall._core.collecting import collecting
from hostcall._core.effects import ORDERED
from hostcall._core.primitive import bind


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


_local = threading.local()


def _bodies() -> list:
  """The frames of ``hostcall.scan`` bodies being traced in this thread,
  with their loops' numbers of steps."""
  if not hasattr(_local, "bodies"):
    _local.bodies = []
  return _local.bodies


def enclosing_loop_length() -> int | None:
  """The number of steps of the loop whose body is being traced here (the
  innermost ``hostcall.scan``, ``lax.scan`` or ``lax.while_loop`` on the
  stack), or None when it has none or a ``while_loop`` runs it."""
  bodies = {id(frame): steps for frame, steps in _bodies()}
  frame = sys._getframe(1)
  while frame is not None:
    if id(frame) in bodies:
      return bodies[id(frame)]
    loop = _jax_private.loop_of_frame(frame)
    if loop is not None:
      return loop[1]
    frame = frame.f_back
  return None


def check_every(every, alternatives: str = "") -> None:
  """Refuses an ``every=`` that is not a Python int >= 1 (with a
  ``ValueError``, whatever came), naming what came and the fix."""
  if isinstance(every, int) and not isinstance(every, bool) and every >= 1:
    return
  expected = f"every must be a positive int (a Python int >= 1{alternatives})"
  if isinstance(every, _jax_private.Tracer):
    raise ValueError(
        f"{expected}, known when the loop is traced: it sets the chunk "
        f"size, the shape of the compiled loop; got a traced value "
        f"({every!r}). Pass a Python int, e.g. every=100; to vary it "
        "between calls of a jitted function, make it a static argument "
        "(jax.jit(..., static_argnames=...)).")
  raise ValueError(f"{expected}, got {every!r} of type "
                   f"{type(every).__name__}; pass a Python int, e.g. "
                   "every=100.")


def scan_length(xs, length: int | None, who: str) -> int:
  """The number of steps of a scan over ``xs`` (or of ``length``); refuses,
  with ``lax.scan``'s own words, what ``lax.scan`` refuses (a ``length``
  that disagrees with ``xs``, leaves of different lengths)."""
  leaves = jax.tree_util.tree_leaves(xs)
  if length is None and not leaves:
    raise ValueError(f"{who} needs xs or length to know its number of steps, "
                     "as jax.lax.scan does.")
  jax.eval_shape(lambda xs: lax.scan(lambda c, x: (c, None), 0, xs,
                                     length=length), xs)
  return int(length if length is not None else leaves[0].shape[0])


def chunked_scan(f: Callable, init, xs=None, length: int | None = None,
                 reverse: bool = False, unroll: int | bool = 1, *,
                 every: int = 64, after_chunk: Callable | None = None,
                 check: Callable | None = None,
                 flush_steps: int | None = None) -> Any:
  """``scan`` with the hooks of hostcall's chunked loops (``chunked.py``:
  progress bars, steered loops).

  Arguments:
    f, init, xs, length, reverse, unroll, every: as for ``scan``.
    after_chunk: called (traced) as ``after_chunk(carry, ys_of_chunk)``
      after each chunk's flush (a bar's tick).
    check: a steered loop's stop check: called (traced) as
      ``check(carry, index)`` after each chunk (``index`` counts chunks from
      1); a non-zero result skips the chunks left (their ``ys`` rows stay
      zeros) and is returned as a third result.
    flush_steps: without ``check``, the taps of consecutive chunks are
      flushed together, up to ``flush_steps`` steps and
      ``buffering.FLUSH_BYTES`` of their values, after the
      ``after_chunk`` of each (a flush costs the host far more than a
      tick). ``f`` is traced once more to size them.

  Returns:
    What ``jax.lax.scan`` returns (and, with ``check``, the reason the loop
    stopped, 0 if it did not).

  (Over 80 lines: its step body, chunk group and parts share what the body's
  trace found (its flush, its orderings, whether it buffers), which each
  closure reads where it is traced.)
  """
  check_callable(f, "hostcall.scan's body f")
  check_every(every)
  steps = scan_length(xs, length, "hostcall.scan")
  if steps == 0:  # no step, no tap: lax.scan gives the empty outputs
    out = lax.scan(f, init, xs, length=0)
    return out if check is None else (*out, jnp.int32(0))
  if reverse:
    flip = lambda t: jax.tree_util.tree_map(lambda a: jnp.flip(a, 0), t)
    out = chunked_scan(f, init, flip(xs), length=length, unroll=unroll,
                       every=every, after_chunk=after_chunk, check=check,
                       flush_steps=flush_steps)
    return (out[0], flip(out[1]), *out[2:])

  flushes, orderings, buffering = [], [], [True]

  def body(carry, x):
    # Taps of one step become extra outputs, stacked by the inner scan.
    # (Its frame is known as this loop's body, of ``steps`` steps, not
    # the chunk's: see ``enclosing_loop_length``.)
    bodies = _bodies()
    bodies.append((sys._getframe(), steps))
    try:
      with collecting(buffering[0]) as collector:
        carry, y = step_output(f(carry, x))
    finally:
      bodies.pop()
    flushes[:] = [_buffering.FlushTarget.of(collector.signature())]
    orderings[:] = collector.orderings
    return carry, (y, [v for _, vals, _ in collector.taps for v in vals])

  # The body traced once first: whether its taps may be buffered at all.
  probe = _buffering.probe(body, init, xs)
  if probe is not None and not _buffering.may_buffer(probe, orderings):
    buffering[0] = False
    probe = None
  flush_ordering = next((o for o in orderings if o in ORDERED), "ordered")

  def group(carry, xs_part, stack, n):
    """Chunks of ``n`` steps, ``stack`` of them stacked (None: one, not
    stacked), ``after_chunk`` after each; one host call flushes their
    taps."""
    def chunk(carry, xs_part):
      carry, (ys, taps) = lax.scan(body, carry, xs_part, length=n,
                                   unroll=unroll)
      if stack is not None and after_chunk is not None:
        after_chunk(carry, ys)
      return carry, (ys, taps)

    merge = lambda t: t if stack is None else jax.tree_util.tree_map(
        lambda a: a.reshape(stack * n, *a.shape[2:]), t)
    # A lone chunk runs as is: a scan of one would add a loop level to the
    # plain loop's program.
    carry, (ys, taps) = (chunk(carry, xs_part) if stack is None else
                         lax.scan(chunk, carry, xs_part, length=stack))
    if flushes[0].targets:  # (a tap without operands buffers no value)
      bind(merge(list(taps)) + [jnp.int32(n * (stack or 1))],
           target=flushes[0], kind="call", ordering=flush_ordering)
    # A lone chunk ticks after its flush, so that the host has its taps by
    # then; stacked ones tick as each ends, before the flush they share.
    if stack is None and after_chunk is not None:
      after_chunk(carry, ys)
    return carry, merge(ys)

  chunks_a_flush = None  # one, unless flush_steps groups them
  if check is not None:
    group = _stoppable(group, check)
    init = (init, jnp.int32(0), jnp.int32(0))  # carry, checks, reason
  elif flush_steps is not None and every < min(flush_steps, steps):
    chunks_a_flush = _buffering.chunks_a_flush(
        probe, sum(flushes[0].sizes) if flushes else 0, every,
        min(flush_steps, steps))

  def part(lo, *lead):
    """``xs`` from step ``lo``, shaped ``lead`` (a None: no axis)."""
    lead = [d for d in lead if d is not None]
    return None if xs is None else jax.tree_util.tree_map(
        lambda a: a[lo:lo + math.prod(lead)].reshape(*lead, *a.shape[1:]), xs)

  # One scan of whole groups, then what is left: fewer chunks than a group
  # (a group still, to share a flush), and fewer steps than a chunk.
  span = every * (chunks_a_flush or 1)
  groups, (left, rest) = steps // span, divmod(steps % span, every)
  carry, ys_parts = init, []
  if groups:
    carry, ys = lax.scan(lambda c, x: group(c, x, chunks_a_flush, every),
                         carry, part(0, groups, chunks_a_flush, every),
                         length=groups)
    ys_parts.append(jax.tree_util.tree_map(
        lambda a: a.reshape(groups * span, *a.shape[2:]), ys))
  lo = groups * span
  for stack, n in ((left, every), (None, rest)):
    if stack != 0 and n:
      xs_part = part(lo, stack, n)
      if lo:
        # Its steps' values tied to the carry of the steps before: XLA
        # would otherwise run a host call that reads only ``xs`` (an
        # unordered tap) before theirs.
        carry, xs_part = lax.optimization_barrier((carry, xs_part))
      carry, ys = group(carry, xs_part, stack, n)
      ys_parts.append(ys)
      lo += n * (stack or 1)
  ys = jax.tree_util.tree_map(lambda *p: jnp.concatenate(p), *ys_parts) \
      if len(ys_parts) > 1 else ys_parts[0]
  if check is not None:
    (carry, _, reason) = carry
    return carry, ys, reason
  return carry, ys


def chunked_while(cond_fun: Callable, body_fun: Callable, init, count, *,
                  steps: int | Callable,
                  after_chunk: Callable | None = None,
                  check: Callable | None = None) -> tuple:
  """``lax.while_loop`` run as chunks of steps, with the hooks of
  ``chunked_scan``.

  Arguments:
    cond_fun, body_fun, init: as for ``jax.lax.while_loop``.
    count: the step count to start from (an int32 scalar: a loop's open's,
      which makes the loop wait for it).
    steps: a chunk's number of steps, at most: an int, or a function called
      (traced) at each chunk's start that returns it (the host's pace).
    after_chunk: called (traced) as ``after_chunk(count, carry)`` after each
      chunk.
    check: called (traced) as ``check((count, carry), index)`` after each
      chunk (``index`` counts chunks from 1); a non-zero result ends the
      loop there.

  Returns:
    ``(count, carry, reason)``: the steps run, the final carry, and the
    reason the loop stopped (0: ``cond_fun`` ended it).
  """
  def chunk(state):
    count, carry, checks, reason = state
    size = steps() if callable(steps) else steps

    def inner_cond(inner):
      return (inner[0] < size) & cond_fun(inner[2])

    def inner_body(inner):
      j, count, carry = inner
      return j + 1, count + 1, body_fun(carry)

    _, count, carry = lax.while_loop(inner_cond, inner_body,
                                     (jnp.int32(0), count, carry))
    if after_chunk is not None:
      after_chunk(count, carry)
    if check is not None:
      checks = checks + 1
      reason = check((count, carry), checks)
    return count, carry, checks, reason

  count, carry, _, reason = lax.while_loop(
      lambda state: cond_fun(state[1]) & (state[3] == 0), chunk,
      (count, init, jnp.int32(0), jnp.int32(0)))
  return count, carry, reason


def _stoppable(group: Callable, check: Callable) -> Callable:
  """``group`` skipped once ``check`` asked to stop: the carry passes
  unchanged and the group's ``ys`` are zeros."""
  def guarded(state, xs_part, *shape):
    carry, checks, reason = state

    def go(operands):
      carry, xs_part = operands
      carry, ys = group(carry, xs_part, *shape)
      return carry, ys, check(carry, checks + 1)

    shapes = jax.eval_shape(lambda operands: go(operands)[1],
                            (carry, xs_part))

    def skip(operands):
      zeros = jax.tree_util.tree_map(
          lambda s: jnp.zeros(s.shape, s.dtype), shapes)
      return operands[0], zeros, reason

    carry, ys, reason = lax.cond(reason == 0, go, skip, (carry, xs_part))
    return (carry, checks + 1, reason), ys

  return guarded
