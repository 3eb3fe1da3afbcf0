"""Host calls in JAX's loops: kept in the body under ``grad``, and ``vmap``
of a ``while_loop`` whose condition makes an ordered host call or whose
body makes a gatable one.

Under ``grad``, JAX splits a ``lax.scan`` (``fori_loop`` of static bounds
too) into the loop that runs forward and the one that runs backward, and
hoists out of the forward body every equation whose operands are the same
at every step. A host call with no operands, or with only the loop's
constants, then ran once instead of once a step (JAX #16637); and an io
call whose operand is the carry was dropped, since JAX's partial
evaluation keeps only the effects it was told to. ``jax_rules`` installs
what keeps both in the loop: JAX's io effects are kept through partial
evaluation, and a body where hoisting would move one of hostcall's calls
is left whole (``moves_a_call``; JAX's own debug and io callbacks are
hoisted as JAX hoists them). Under ``linearize``, the loop staged for the
tangents leaves out the primal calls the known loop made
(``strip_made_calls``).

The rest of this module is the ``while`` rewrite:

JAX lowers a while loop whose condition has ordered effects by evaluating
the condition once before the loop and once at the end of every iteration,
carrying the predicate; when ``vmap`` has batched that predicate, this path
reduces it with ``or`` and never selects per lane, so lanes that have
finished keep advancing (a tap in the condition would change the result).
Without ordered effects, the other path evaluates the condition twice per
iteration, which hostcall's unordered calls (``debug_callback``,
``debug_print``) keep, as JAX's own do.

hostcall makes the same rewrite one step earlier, in the batching rule of
``while``, when the condition holds an ordered hostcall (a legacy tap, an
ordered debug callback): the condition runs before
the loop and at the end of each iteration's body, its predicate becomes part
of the carry, and the new loop's condition (just that predicate) has no
effect, so JAX's usual batching selects each lane's carry and predicate.
The host sees what the legacy ``host_callback`` showed it: the condition's
values once before the loop and once per iteration, for the whole batch.

A batched predicate also gates the body's gatable calls (``gating``: each
is made only for the lanes still looping), the carried predicate being
their gate where the condition is carried so, the condition evaluated again
at the top of the body elsewhere; such a loop is batched as JAX's rule
batches it, without its refusal of the io effect of the gated io calls.
Every other ``while`` batches exactly as before.
"""

from __future__ import annotations

import re

import jax
from jax.extend import core as jex_core
from jax.extend.core import primitives

from hostcall import _jax_private
from hostcall._core import gating, rewriting
from hostcall._core.effects import KEPT_IN_LOOPS, ORDERED_HOST_EFFECT_TYPES
from hostcall._core.primitive import hostcall_p

# JAX's own rule, read before ``jax_rules`` replaces it: every loop this
# module does not rewrite goes to it.
_batch_while = _jax_private.fancy_primitive_batchers[primitives.while_p]


def _spec(aval) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                              weak_type=getattr(aval, "weak_type", False))


def _predicate_carried(cond_jaxpr, body_jaxpr, n_cond_consts, n_body_consts,
                       gate: bool = False):
  """The loop's body and condition with the predicate in the carry (and,
  ``gate``, each gatable call of the body given it: the lanes still
  looping)."""
  cond = jex_core.jaxpr_as_fun(cond_jaxpr)
  body = jex_core.jaxpr_as_fun(body_jaxpr)
  avals = cond_jaxpr.in_avals
  cond_consts, carry = avals[:n_cond_consts], avals[n_cond_consts:]
  body_consts = body_jaxpr.in_avals[:n_body_consts]
  pred = cond_jaxpr.out_avals[0]

  def new_cond(pred, *carry):
    del carry
    return pred

  def new_body(*args):
    cconsts = args[:n_cond_consts]
    bconsts = args[n_cond_consts:n_cond_consts + n_body_consts]
    pred = args[n_cond_consts + n_body_consts]
    carry = args[n_cond_consts + n_body_consts + 1:]
    step = gating.gated(body_jaxpr, pred) if gate else body
    carry = step(*bconsts, *carry)
    return (cond(*cconsts, *carry)[0], *carry)

  specs = [_spec(a) for a in (pred, *carry)]
  new_cond_jaxpr = jax.make_jaxpr(new_cond)(*specs)
  new_body_jaxpr = jax.make_jaxpr(new_body)(
      *[_spec(a) for a in (*cond_consts, *body_consts)], *specs)
  return new_cond_jaxpr, new_body_jaxpr


def _predicate_is_batched(axis_data, dims, cond_nconsts, cond_jaxpr,
                          body_nconsts, body_jaxpr) -> bool:
  """Whether JAX's rule would batch the predicate (its own fixpoint)."""
  batched = [d is not None for d in dims]
  n_consts = cond_nconsts + body_nconsts
  cconst_bat, bconst_bat = batched[:cond_nconsts], batched[cond_nconsts:n_consts]
  carry_bat = batched[n_consts:]
  for _ in range(1 + len(carry_bat)):
    _, carry_out = _jax_private.batch_jaxpr(
        body_jaxpr, axis_data, bconst_bat + carry_bat, carry_bat)
    if carry_out == carry_bat:
      break
    carry_bat = [a or b for a, b in zip(carry_bat, carry_out)]
  _, (pred_bat,) = _jax_private.batch_jaxpr(
      cond_jaxpr, axis_data, cconst_bat + carry_bat, False)
  return pred_bat


def while_batching_rule(axis_data, args, dims, *, cond_nconsts, cond_jaxpr,
                        body_nconsts, body_jaxpr):
  """``while``'s batching rule (installed by ``jax_rules``): a condition
  holding one of hostcall's ordered effects, or a body holding a gatable
  call, under a batched predicate, is rewritten; every other loop goes to
  JAX's rule."""
  params = dict(cond_nconsts=cond_nconsts, cond_jaxpr=cond_jaxpr,
                body_nconsts=body_nconsts, body_jaxpr=body_jaxpr)
  ordered = any(isinstance(e, ORDERED_HOST_EFFECT_TYPES)
                for e in cond_jaxpr.effects)
  gate = gating.while_gate(cond_jaxpr, body_jaxpr)
  if (not (ordered or gate)
      or not _predicate_is_batched(axis_data, dims, **params)):
    # JAX's rule and lowering are right for an unbatched predicate: the
    # condition runs once per iteration, and every lane loops as long.
    return _batch_while(axis_data, args, dims, **params)
  n_consts = cond_nconsts + body_nconsts
  cconsts, bconsts = args[:cond_nconsts], args[cond_nconsts:n_consts]
  cdims, bdims = dims[:cond_nconsts], dims[cond_nconsts:n_consts]
  if not ordered:
    if gate == "gate":
      # Each gatable call of the body told whether its lane still loops.
      new_body = gating.gated_body(cond_jaxpr, body_jaxpr, cond_nconsts,
                                   body_nconsts)
      if new_body is None:
        return _batch_while(axis_data, args, dims, **params)
      args = [*cconsts, *args]
      dims = [*cdims, *dims]
      params.update(body_nconsts=n_consts, body_jaxpr=new_body)
    return gating.batch_every_lane(axis_data, args, dims, **params)
  # A batched predicate batches the whole carry (as JAX's rule does), from
  # the condition's first evaluation on.
  init = [_jax_private.broadcast_batched(x, axis_data, d)
          for x, d in zip(args[n_consts:], dims[n_consts:])]
  idims = [0] * len(init)
  first_cond = _jax_private.batch_jaxpr_axes(
      cond_jaxpr, axis_data, list(cdims) + idims, [0])
  (pred,) = jex_core.jaxpr_as_fun(first_cond)(*cconsts, *init)
  new_cond, new_body = _predicate_carried(cond_jaxpr, body_jaxpr,
                                          cond_nconsts, body_nconsts,
                                          gate == "gate")
  batch = gating.batch_every_lane if gate == "gate" else _batch_while
  outs, out_dims = batch(
      axis_data, [*cconsts, *bconsts, pred, *init],
      [*cdims, *bdims, 0, *idims], cond_nconsts=0, cond_jaxpr=new_cond,
      body_nconsts=n_consts, body_jaxpr=new_body)
  return outs[1:], out_dims[1:]


def moves_a_call(closed_jaxpr, n_consts: int) -> bool:
  """Whether hoisting would move one of hostcall's calls out of this
  loop body: one whose operands all stay the same from step to step (its
  first ``n_consts`` inputs and constants do), at its top or in a jaxpr
  of an equation hoisted whole. (JAX's own callbacks are left as JAX
  runs them, and a body whose calls all read the carry is hoisted as JAX
  hoists it: only this case pays for keeping the body whole.)"""
  if not any(isinstance(e, KEPT_IN_LOOPS) for e in closed_jaxpr.effects):
    return False
  jaxpr = getattr(closed_jaxpr, "jaxpr", closed_jaxpr)
  # A call inside a nested loop or cond counts too: hoisting splits a
  # nested while_loop (its part that does not read the carry moves out).
  invariant = set()
  _known_calls(jaxpr, [False] * n_consts + [True] * (len(jaxpr.invars)
                                                     - n_consts),
               lambda eqn: eqn.primitive is hostcall_p and eqn.effects,
               invariant)
  if invariant:
    return True
  varying = set(jaxpr.invars[n_consts:])
  for eqn in jaxpr.eqns:
    if any(v in varying for v in eqn.invars
           if not isinstance(v, jex_core.Literal)):
      varying.update(eqn.outvars)
    elif _holds_a_call(eqn, hostcall_p):
      return True
  return False


def _primal_call(eqn) -> bool:
  """A call of hostcall's that a loop's tangents do not read: one with
  no results, or a tap (its results are its operands)."""
  return (eqn.primitive is hostcall_p
          and (eqn.params["kind"] == "tap" or not eqn.outvars))


def strip_made_calls(body_jaxpr, unknown):
  """The staged loop's body without the primal calls the known loop
  has made already: those whose operands it had (None where there are
  none, or where ``rewriting`` cannot reach one)."""
  made = set()
  _known_calls(body_jaxpr, unknown, _primal_call, made)
  if not made or not rewriting.plan(body_jaxpr,
                                    lambda eqn: id(eqn) in made):
    return None

  def without_made_calls(eqn, invals):
    if id(eqn) not in made:
      return None
    return list(invals) if eqn.params["kind"] == "tap" else []
  return jax.make_jaxpr(rewriting.as_function(body_jaxpr,
                                              without_made_calls))(
      *[_spec(a) for a in body_jaxpr.in_avals])


def _known_calls(jaxpr, unknown: list[bool], picked, made: set) -> list[bool]:
  """Adds to ``made`` the ids of the equations ``picked`` whose operands
  do not depend on an ``unknown`` input (partial evaluation runs those in
  the known loop), through nested jits, loops and conds; returns which of
  ``jaxpr``'s outputs do."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  env = dict(zip(jaxpr.invars, unknown))
  read = lambda v: (not isinstance(v, jex_core.Literal)) and env.get(v, False)
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    if picked(eqn) and not any(ins):
      made.add(id(eqn))
    outs = _known_calls_inside(eqn, ins, picked, made)
    for v, flag in zip(eqn.outvars, outs):
      env[v] = flag
  return [read(v) for v in jaxpr.outvars]


def _known_calls_inside(eqn, ins, picked, made) -> list[bool]:
  inner = rewriting.inner_jaxprs(eqn) if eqn.effects else []
  if not inner or (eqn.primitive is primitives.cond_p and ins[0]):
    return [any(ins)] * len(eqn.outvars)  # no call inside reached, or all
  params, prim = eqn.params, eqn.primitive
  if prim is primitives.cond_p:
    outs = [_known_calls(b, ins[1:], picked, made) for b in inner]
    return [any(flags) for flags in zip(*outs)]
  if prim is primitives.scan_p:
    n_consts, n_carry = _jax_private.scan_layout(params)
    consts, carry = ins[:n_consts], ins[n_consts:n_consts + n_carry]
    xs = ins[n_consts + n_carry:]
    for _ in range(n_carry + 1):  # the carry's fixpoint, then the last walk
      trial = set()
      outs = _known_calls(inner[0], consts + carry + xs, picked, trial)
      grown = [a or b for a, b in zip(carry, outs[:n_carry])]
      if grown == carry:
        break
      carry = grown
    made |= trial
    return outs
  if prim is primitives.while_p:
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts = ins[:n_cond], ins[n_cond:n_cond + n_body]
    carry = ins[n_cond + n_body:]
    for _ in range(len(carry) + 1):
      trial = set()
      outs = _known_calls(inner[1], body_consts + carry, picked, trial)
      grown = [a or b for a, b in zip(carry, outs)]
      if grown == carry:
        break
      carry = grown
    (pred,) = _known_calls(inner[0], cond_consts + carry, picked, trial)
    if pred:  # a loop whose predicate is unknown is staged whole
      return [True] * len(eqn.outvars)
    made |= trial
    return carry
  return _known_calls(inner[0], ins, picked, made)  # a nested jit


def _holds_a_call(eqn, host_primitive) -> bool:
  if eqn.primitive is host_primitive:
    return bool(eqn.effects)
  return bool(eqn.effects) and any(
      _holds_a_call(inner, host_primitive)
      for value in eqn.params.values()
      for jaxpr in _jaxprs_in(value)
      for inner in getattr(jaxpr, "jaxpr", jaxpr).eqns)


def _jaxprs_in(value) -> list:
  if isinstance(value, (jex_core.Jaxpr, jex_core.ClosedJaxpr)):
    return [value]
  if isinstance(value, (tuple, list)):
    return [v for v in value if isinstance(v, (jex_core.Jaxpr,
                                               jex_core.ClosedJaxpr))]
  return []


def explain_checkpoint_refusal(message: str) -> str:
  """JAX's refusal of an io callback under ``jax.checkpoint``, with what
  to do instead (added where JAX raises it, by ``jax_rules``)."""
  if "IOEffect" not in message:
    return message
  # JAX names the effects by their objects' default repr (an address).
  message = re.sub(r"<[\w.]*?(\w+) object at 0x[0-9a-fA-F]+>", r"\1", message)
  return (
      f"{message}\nhostcall: an io_callback inside jax.checkpoint (or "
      "jax.remat) cannot be differentiated: JAX would have to choose between "
      "running the impure call again in the backward pass and saving it, and "
      "refuses. Call it outside the checkpointed function, or use "
      "hostcall.debug_callback (runs as jax.debug.callback does under every "
      "checkpoint policy) or hostcall.host_callback.id_tap (runs again where "
      "its inputs are rematerialised) for a call made for its effect.")
