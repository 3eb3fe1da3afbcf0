"""A checked pass's report: one asynchronous, result-less host call, made
only where the pass found something, told which ``vmap`` member found it.

Under ``vmap`` what a pass found is batched, one ``Found`` a member. A
``jax.custom_batching.custom_vmap`` rule reduces it over each ``vmap``
level, innermost first, to the member whose find ran first (ties: the
lowest index), its index put in front of those of the levels inside it,
and counts the members that found something. What reaches the host is one
call, under a ``cond`` on the device: a pass that found nothing makes no
host call, under ``vmap`` too (where a ``cond`` of a batched predicate
would run its branch for every batch). The call is queued (asynchronous
delivery): the device never waits for the host to look.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from hostcall._apps.nans import found as found_
from hostcall._core import delivery as deliveries
from hostcall._flavours.debug import stage_debug

_LATEST = jnp.iinfo(jnp.int32).max


def report(found: found_.Found, reporter) -> None:
  """Sends ``found`` to ``reporter`` (a ``sites.Reporter``) on the host
  where it holds something, from any number of ``vmap`` levels."""
  count = (found.code > found_.NOTHING).astype(jnp.int32)
  values = (found.code, found.site, found.when, found.steps,
            jnp.zeros((0,), jnp.int32), count)
  if _custom_vmap_keeps_effects():
    _reporting(reporter)(*values)
  else:  # (JAX 0.8: the report would be dropped as unused)
    _send(reporter, *values)


@functools.cache
def _custom_vmap_keeps_effects() -> bool:
  """Whether this JAX keeps the effects of a ``custom_vmap`` function's
  body (JAX 0.8 drops them, and with them a call whose result is unused:
  there the report is sent without the rule that picks a ``vmap``
  member)."""
  @jax.custom_batching.custom_vmap
  def probe(x):
    jax.debug.callback(lambda: None)
    return x

  probe.def_vmap(lambda axis_size, in_batched, x: (x, in_batched[0]))
  return bool(jax.make_jaxpr(probe)(jnp.int32(0)).effects)


def _send(reporter, code, site, when, steps, member, count):
  del when  # (orders members only)

  def call():
    with deliveries.delivery("async"):
      stage_debug("find_nans", reporter, (code, site, steps, member, count),
                  {}, "unordered", False)

  jax.lax.cond(code > found_.NOTHING, call, lambda: None)


def _reporting(reporter):
  """The report of ``reporter``'s finds, as a function of one member's
  values, batched by its own rule."""

  @jax.custom_batching.custom_vmap
  def send(code, site, when, steps, member, count):
    _send(reporter, code, site, when, steps, member, count)
    return jnp.int32(0)

  @send.def_vmap
  def one_level(axis_size, in_batched, *values):
    code, site, when, steps, member, count = [
        v if batched else jnp.broadcast_to(v, (axis_size, *jnp.shape(v)))
        for v, batched in zip(values, in_batched)]
    # The member whose find ran first; nothing found: the clock's end.
    order = jnp.where(code > found_.NOTHING, when, _LATEST)
    first = jnp.argmin(order).astype(jnp.int32)
    send(code[first], site[first], when[first], steps[first],
         jnp.concatenate([first[None], member[first]]), jnp.sum(count))
    return jnp.int32(0), False

  return send
