"""The equations that run other jaxprs, rebuilt around checked bodies with
``jax``'s and ``lax``'s own functions: a nested ``jit``, ``scan``,
``while_loop``, ``cond``/``switch`` and ``checkpoint``.

Each gives what its body found to the enclosing region (``Region.add``),
with the clock after it. A loop carries what its steps found so far and a
step counter beside its own carry, and keeps the first step that found
something; its step is the one the user wrote: the index into a ``scan``'s
``xs`` (so that a reversed scan, a forward loop's transpose in the backward
pass, reports the forward step), the iteration of a ``while_loop``. A
``while_loop``'s condition is evaluated unchecked: what it computes it
computes again after the body, whose checks see the values first.

Only the parameters every JAX release in range shares are read; a nested
``jit``'s shardings and donations are not kept (it runs inside the checked
program's own ``jit``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from hostcall import _jax_private
from hostcall._apps.nans import found as found_
from hostcall._apps.nans.region import Place


def _body(checker, jaxpr, place: Place) -> Callable:
  """``jaxpr`` as a function ``(clock, *args) -> (outs, found, clock)``, its
  checks in a region of its own, with room for ``depth_of(jaxpr)`` steps."""
  depth = checker.depth_of(jaxpr)

  def run(clock, *args):
    region = checker.new_region(depth, clock)
    outs = checker.closed(jaxpr, list(args), region, place)
    return outs, region.found(), region.now()

  return run


def jit(checker, eqn, invals, jaxprs, region, place) -> list:
  (body,) = jaxprs
  run = _body(checker, body, place)
  run.__name__ = str(eqn.params.get("name", "jit"))
  outs, found, clock = jax.jit(run, inline=eqn.params.get("inline", False))(
      region.now(), *invals)
  region.add(found, clock)
  return list(outs)


def checkpoint(checker, eqn, invals, jaxprs, region, place) -> list:
  (body,) = jaxprs
  params = eqn.params
  run = jax.checkpoint(_body(checker, body, place),
                       prevent_cse=params.get("prevent_cse", True),
                       policy=params.get("policy"))
  outs, found, clock = run(region.now(), *invals)
  region.add(found, clock)
  return list(outs)


def cond(checker, eqn, invals, jaxprs, region, place) -> list:
  index, *ops = invals
  depth = max(checker.depth_of(b) for b in jaxprs)

  def branch(jaxpr):
    run = _body(checker, jaxpr, place)

    def padded(clock, *args):
      outs, found, clock = run(clock, *args)
      return outs, found_.pad(found, depth), clock
    return padded

  outs, found, clock = jax.lax.switch(index, [branch(b) for b in jaxprs],
                                      region.now(), *ops)
  region.add(found, clock)
  return list(outs)


def scan(checker, eqn, invals, jaxprs, region, place) -> list:
  (body,) = jaxprs
  params = eqn.params
  n_consts, n_carry = _jax_private.scan_layout(params)
  consts = invals[:n_consts]
  carry, xs = invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]
  length, reverse = params["length"], params["reverse"]
  run = _body(checker, body, place.inside("scan"))

  def step(state, x):
    carry, first, clock, i = state
    outs, found, clock = run(clock, *consts, *carry, *x)
    index = length - 1 - i if reverse else i
    first = found_.earlier(first, found_.with_step(found, index))
    return (outs[:n_carry], first, clock, i + 1), outs[n_carry:]

  start = (list(carry), found_.nothing(checker.depth_of(body) + 1),
           region.now(), jnp.int32(0))
  (carry, first, clock, _), ys = jax.lax.scan(
      step, start, list(xs), length=length, reverse=reverse,
      unroll=params.get("unroll", 1))
  region.add(first, clock)
  return [*carry, *ys]


def while_loop(checker, eqn, invals, jaxprs, region, place) -> list:
  (body,) = jaxprs
  params = eqn.params
  n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
  cond_consts = invals[:n_cond]
  body_consts = invals[n_cond:n_cond + n_body]
  keep_going = jex_core.jaxpr_as_fun(params["cond_jaxpr"])
  run = _body(checker, body, place.inside("while_loop"))

  def step(state):
    values, first, clock, i = state
    outs, found, clock = run(clock, *body_consts, *values)
    return outs, found_.earlier(first, found_.with_step(found, i)), clock, i + 1

  start = (list(invals[n_cond + n_body:]),
           found_.nothing(checker.depth_of(body) + 1), region.now(),
           jnp.int32(0))
  values, first, clock, _ = jax.lax.while_loop(
      lambda state: keep_going(*cond_consts, *state[0])[0], step, start)
  region.add(first, clock)
  return list(values)


#: The rebuilt equations' kinds (``interpreter.kind_of``) and rebuilders,
#: each ``(checker, eqn, invals, inner jaxprs, region, place) -> outs``.
REBUILT = {"jit": jit, "checkpoint": checkpoint, "cond": cond, "scan": scan,
           "while": while_loop}
