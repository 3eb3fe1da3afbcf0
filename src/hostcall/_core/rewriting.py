"""A jaxpr evaluated again with some of its equations rewritten, wherever
they sit: at the top, in a nested ``jit``, in a ``scan``'s or a
``while_loop``'s body, in a ``cond``'s branches (those rebuilt with
``lax``'s own functions, so that no parameter layout of JAX's loop
primitives is needed beyond ``scan``'s consts and carry).

Used by ``gating`` (a call in a ``cond`` branch under ``vmap`` given the
lanes that took the branch) and by ``hostcall.jit`` (JAX's own callbacks
made hostcall's, so that they can be deferred).
"""

from __future__ import annotations

from typing import Callable

import jax
from jax.extend import core as jex_core
from jax.extend.core import primitives

from hostcall import _jax_private

_NESTED_JIT = tuple(p for p in (getattr(primitives, "jit_p", None),
                                getattr(primitives, "pjit_p", None),
                                primitives.closed_call_p) if p is not None)

#: ``rewrite(eqn, invals)``: the equation's outputs, bound in the current
#: trace, or None to leave it as it is.
Rewrite = Callable[[object, list], "list | None"]


def inner_jaxprs(eqn) -> list | None:
  """The jaxprs ``eqn`` runs that ``evaluate`` rewrites through (a nested
  ``jit``, a ``scan``, a ``while_loop``, a ``cond``), [] for any other
  equation, None for one of those it cannot rebuild."""
  params, prim = eqn.params, eqn.primitive
  if prim in _NESTED_JIT:
    return [params.get("jaxpr") or params["call_jaxpr"]]
  if prim is primitives.scan_p:
    return [params["jaxpr"]] if _jax_private.scan_layout(params) else None
  if prim is primitives.while_p:
    return [params["cond_jaxpr"], params["body_jaxpr"]]
  if prim is primitives.cond_p:
    return None if "branches_platforms" in params else list(
        params["branches"])
  return []


def effectful(eqn) -> bool:
  """Whether ``eqn`` has a side effect (not only named axes or its own
  mutable arrays)."""
  return any(not isinstance(e, _jax_private.NOT_REALLY_EFFECTS)
             for e in eqn.effects)


def plan(jaxpr, rewritten: Callable[[object], bool],
         passable: Callable[[object], bool] = lambda eqn: False
         ) -> bool | None:
  """True where ``jaxpr`` (open or closed) holds an equation ``rewritten``
  picks that ``evaluate`` can reach, None where it holds another effectful
  equation that a rewrite cannot reach past (an effect of a primitive it
  cannot rebuild, unless ``passable`` says it is bound again as it is),
  False where it holds neither."""
  found = False
  for eqn in _open(jaxpr).eqns:
    if rewritten(eqn):
      found = True
      continue
    if not (eqn.effects and effectful(eqn)) or passable(eqn):
      continue
    inner = inner_jaxprs(eqn)
    if not inner:
      return None
    for sub in inner:
      verdict = plan(sub, rewritten, passable)
      if verdict is None:
        return None
      found |= verdict
  return found


def _open(jaxpr):
  return getattr(jaxpr, "jaxpr", jaxpr)


def as_function(closed, rewrite: Rewrite) -> Callable:
  """``closed`` (a closed jaxpr) as a function of its operands, its
  equations rewritten by ``rewrite``."""
  return lambda *args: evaluate(_open(closed), getattr(closed, "consts", ()),
                                args, rewrite)


def evaluate(jaxpr, consts, args, rewrite: Rewrite) -> list:
  """``jaxpr`` evaluated in the current trace, each equation that
  ``rewrite`` answers replaced by its answer, through nested jits, loops
  and conds whose jaxprs hold an effectful equation."""
  env = {}

  def read(v):
    return v.val if isinstance(v, jex_core.Literal) else env[v]

  for v, x in zip(jaxpr.constvars, consts):
    env[v] = x
  for v, x in zip(jaxpr.invars, args):
    env[v] = x
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    with _jax_private.source_context_of(eqn):  # (the user's file and line)
      outs = rewrite(eqn, invals)
    if outs is None:
      if eqn.effects and effectful(eqn) and inner_jaxprs(eqn):
        outs = _rebuild(eqn, invals, rewrite)
      else:
        outs = _jax_private.bind_equation(eqn, invals)
        if not eqn.primitive.multiple_results:
          outs = [outs]
    for v, x in zip(eqn.outvars, outs):
      env[v] = x
  return [read(v) for v in jaxpr.outvars]


def _rebuild(eqn, invals, rewrite: Rewrite) -> list:
  """A nested jit, loop or cond, its equations rewritten."""
  params, prim = eqn.params, eqn.primitive
  if prim in _NESTED_JIT:
    return as_function(params.get("jaxpr") or params["call_jaxpr"],
                       rewrite)(*invals)
  if prim is primitives.scan_p:
    n_consts, n_carry = _jax_private.scan_layout(params)
    consts = invals[:n_consts]
    carry, xs = invals[n_consts:n_consts + n_carry], invals[n_consts + n_carry:]
    body = as_function(params["jaxpr"], rewrite)

    def step(carry, x):
      outs = body(*consts, *carry, *x)
      return outs[:n_carry], outs[n_carry:]
    carry, ys = jax.lax.scan(step, list(carry), list(xs),
                             length=params["length"],
                             reverse=params["reverse"],
                             unroll=params.get("unroll", 1))
    return [*carry, *ys]
  if prim is primitives.while_p:
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    cond_consts = invals[:n_cond]
    body_consts = invals[n_cond:n_cond + n_body]
    cond = as_function(params["cond_jaxpr"], rewrite)
    body = as_function(params["body_jaxpr"], rewrite)
    return jax.lax.while_loop(lambda c: cond(*cond_consts, *c)[0],
                              lambda c: body(*body_consts, *c),
                              list(invals[n_cond + n_body:]))
  index, *ops = invals
  return jax.lax.switch(index, [as_function(b, rewrite)
                                for b in params["branches"]], *ops)
