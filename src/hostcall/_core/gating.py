"""``vmap`` of a ``cond`` whose predicate is batched: host calls only for
the lanes that took their branch; ``vmap`` of a ``while_loop`` whose
predicate is batched: host calls in its body only for the lanes still
looping.

JAX batches such a ``cond`` (``switch`` too) by running every branch for
every lane and selecting each lane's results, so a debug callback in a
branch ran for lanes that never took it (JAX #19314, #15039), and JAX
refuses io callbacks there. hostcall makes the same rewrite in ``cond``'s
batching rule (``cond_batching_rule``, installed by ``jax_rules``), but
first gives each of its gatable calls in a branch one more operand, the
lane's "took this branch" flag, and a ``("gate",)`` entry in its
``transforms``: the host drops the lanes whose flag is false
(``CallbackTarget.deliver``), so a call sees only the lanes that took its
branch.

A gatable call is a result-less one whose target says so
(``HostTarget.gatable``: JAX's impure flavours, not the legacy taps, whose
module showed the whole batch); a call with results is not (its branch
goes on with them for every lane), and an io callback with results stays
refused, as JAX refuses it. Calls are gated where they sit at the top of
a branch and in nested ``jit``s, ``scan``s, ``while_loop``s and ``cond``s
(rebuilt with ``lax``'s functions; a call in nested batched ``cond``s gets
one gate per ``cond``, the lane must have taken every branch). A branch
holding an effect this cannot reach past (a call inside ``checkpoint``,
``custom_jvp`` or ``custom_vjp`` there, JAX's own io callback) leaves the
whole ``cond`` to JAX's rule, unchanged: every lane, as JAX. Under an
unbatched predicate the ``cond`` stays one (every lane takes the same
branch), so io callbacks with results run there too, once.

A ``while_loop`` whose predicate ``vmap`` batched runs its body for every
lane while any lane's predicate holds, and keeps the old carry of the lanes
whose predicate is false: a debug callback in the body ran for lanes that
had finished, with their last values again (JAX #20628), and JAX refuses
io callbacks there. ``control_flow``'s batching rule of ``while`` asks
``while_gate`` whether to do better, and if so gives each gatable call in
the body the lane's predicate as its gate (``gated_body``): the condition
evaluated again at the top of the body (as JAX's lowering of such a loop
does to select the carry; XLA computes it once), with hostcall's
result-less calls and taps left out of that evaluation, so that the
condition's own calls run as often as before. A loop whose predicate an
inner ``vmap`` batched already (a ``vmap`` of ``vmap``) needs no new gate:
the gate computed in its body is batched with it, lane by lane
(``"gated"``). The same walls as for ``cond``: a call with results is not
gated (``pure_callback`` runs for every lane, an io callback with results
stays refused), a body holding an effect ``rewriting`` cannot reach past
(a call in ``checkpoint``, JAX's own callbacks) or a condition holding an
io callback is left to JAX's rule, unchanged, and so is every ordered io
callback (refused under ``vmap`` of any ``while_loop``, as by JAX).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.extend import core as jex_core
from jax.extend.core import primitives

from hostcall import _jax_private
from hostcall._core import rewriting
from hostcall._core.context import GATE
from hostcall._core.primitive import hostcall_p

# JAX's own rule, read before ``jax_rules`` replaces it: every ``cond``
# this module does not rewrite goes to it.
_batch_cond = _jax_private.fancy_primitive_batchers[primitives.cond_p]


def _runs_where_written(eqn) -> bool:
  """A call of JAX's impure flavours (made once where its ``cond`` branch
  is taken)."""
  return (eqn.primitive is hostcall_p
          and eqn.params["target"].gatable)


def gatable(eqn) -> bool:
  """Such a call without results: under a batched predicate it can be left
  out for a lane. (A call with results cannot: the branch goes on with
  them for every lane, and a made-up value could steer a loop there
  forever; JAX's refusal of io callbacks there stands.)"""
  return (_runs_where_written(eqn) and not eqn.params["result_avals"])


def gated(closed, taken):
  """``closed`` as a function of its operands, each gatable call, wherever
  it sits, given ``taken``."""
  def rewrite(eqn, invals):
    if not gatable(eqn):
      return None
    params = dict(eqn.params, transforms=eqn.params["transforms"] + (GATE,))
    outs = hostcall_p.bind(*invals, taken, **params)
    return outs[:-1] if eqn.params["kind"] == "tap" else outs
  return rewriting.as_function(closed, rewrite)


def cond_batching_rule(axis_data, args, dims, *, branches, **params):
  """``cond``'s batching rule (installed by ``jax_rules``): branches
  holding gatable calls of ``hostcall_p`` are rewritten; every other
  ``cond`` goes to JAX's rule."""
  index_dim = dims[0]
  picked = _runs_where_written if index_dim is None else gatable
  plans = [rewriting.plan(b, picked) for b in branches]
  if None in plans or not any(plans) or "branches_platforms" in params:
    return _batch_cond(axis_data, args, dims, branches=branches, **params)
  if index_dim is None:
    return _one_branch_for_all_lanes(axis_data, args, dims, branches, params)
  # As JAX's rule: every operand batched in front, every branch run for
  # every lane, each lane's results selected by its index; and each
  # gatable call told, per lane, whether its branch was taken.
  index, *ops = [_jax_private.broadcast_batched(x, axis_data, d)
                 for x, d in zip(args, dims)]
  outs_per_branch = []
  for i, branch in enumerate(branches):
    taken = index == i

    def gated_branch(taken, *ops, branch=branch):
      return gated(branch, taken)(*ops)

    specs = [jax.ShapeDtypeStruct((), np.bool_),
             *[jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(
                 a, "weak_type", False)) for a in branch.in_avals]]
    gated_jaxpr = jax.make_jaxpr(gated_branch)(*specs)
    batched = _jax_private.batch_jaxpr_axes(
        gated_jaxpr, axis_data, [0] * (1 + len(ops)),
        [0] * len(branch.out_avals))
    # The operands each branch sees are stopped from differentiating
    # through the lanes that did not take it, as in JAX's rule (#1052).
    ops_i = [_select_lanes(taken, x, jax.lax.stop_gradient(x)) for x in ops]
    outs_per_branch.append(jex_core.jaxpr_as_fun(batched)(taken, *ops_i))
  outs = [_select_lanes_n(index, list(column))
          for column in zip(*outs_per_branch)]
  return outs, [0] * len(outs)


def _one_branch_for_all_lanes(axis_data, args, dims, branches, params):
  """An unbatched predicate: the cond stays a cond, every lane takes the
  same branch, and its calls need no gate. JAX's rule, without its refusal
  of io effects (made for the select it makes of a batched predicate)."""
  index, *ops = args
  ops_bat = [d is not None for d in dims[1:]]
  ops = [_jax_private.broadcast_batched(x, axis_data, d) if d is not None
         else x for x, d in zip(ops, dims[1:])]
  out_bat = [any(column) for column in zip(*[
      _jax_private.batch_jaxpr(b, axis_data, ops_bat, False)[1]
      for b in branches])]
  batched = tuple(_jax_private.batch_jaxpr(b, axis_data, ops_bat, out_bat)[0]
                  for b in branches)
  outs = primitives.cond_p.bind(index, *ops, branches=batched, **params)
  return outs, [0 if b else None for b in out_bat]


def while_gate(cond_jaxpr, body_jaxpr) -> str | None:
  """What ``vmap`` of a ``while_loop`` whose predicate it batches does with
  the body's gatable calls: ``"gate"`` (a scalar predicate: each is given
  its lane's predicate, ``gated_body``), ``"gated"`` (a predicate an inner
  ``vmap`` batched: its calls have their lanes' gates, and only JAX's
  refusal of their io effect is to be passed: ``batch_every_lane``), or
  None (nothing to gate, or a loop left to JAX's rule)."""
  if not body_jaxpr.effects:
    return None
  io_effects = (_jax_private.IO_EFFECT, _jax_private.ORDERED_IO_EFFECT)
  if (any(e in io_effects for e in cond_jaxpr.effects)
      or _jax_private.ORDERED_IO_EFFECT in body_jaxpr.effects):
    return None  # JAX's refusals stand
  if cond_jaxpr.out_avals[0].shape:
    if _jax_private.IO_EFFECT not in body_jaxpr.effects:
      return None  # JAX's rule does the same
    return "gated" if rewriting.plan(body_jaxpr, _gated_already) else None
  return "gate" if rewriting.plan(body_jaxpr, gatable) else None


def _gated_already(eqn) -> bool:
  return gatable(eqn) and GATE in eqn.params["transforms"]


def _quiet(eqn) -> bool:
  """A result-less call or a tap of hostcall's: left out where a
  condition is evaluated again only for its predicate."""
  return (eqn.primitive is hostcall_p
          and (eqn.params["kind"] == "tap" or not eqn.params["result_avals"]))


def gated_body(cond_jaxpr, body_jaxpr, cond_nconsts: int,
               body_nconsts: int):
  """The body of a ``while_loop`` (its operands: the condition's constants,
  the body's, the carry) whose gatable calls are each given the lane's
  predicate, evaluated again from the carry; None where the condition
  holds an effect that cannot be left out of that evaluation."""
  verdict = rewriting.plan(cond_jaxpr, _quiet)
  if verdict is None:
    return None

  def leave_out(eqn, invals):
    if not _quiet(eqn):
      return None
    return list(invals) if eqn.params["kind"] == "tap" else []
  cond = (rewriting.as_function(cond_jaxpr, leave_out) if verdict
          else jex_core.jaxpr_as_fun(cond_jaxpr))

  def body(*args):
    cond_consts, rest = args[:cond_nconsts], args[cond_nconsts:]
    carry = rest[body_nconsts:]
    (pred,) = cond(*cond_consts, *carry)
    return gated(body_jaxpr, pred)(*rest)

  return jax.make_jaxpr(body)(*[_spec(a) for a in (
      *cond_jaxpr.in_avals[:cond_nconsts], *body_jaxpr.in_avals)])


def batch_every_lane(axis_data, args, dims, *, cond_nconsts, cond_jaxpr,
                     body_nconsts, body_jaxpr):
  """JAX's batching of a ``while_loop`` whose predicate is batched (every
  lane's carry batched in front, the body run for every lane while any
  lane's predicate holds, each lane's carry selected by it), without its
  refusal of io effects: the body's io calls are gated."""
  n_consts = cond_nconsts + body_nconsts
  cdims, bdims = list(dims[:cond_nconsts]), list(dims[cond_nconsts:n_consts])
  init = [_jax_private.broadcast_batched(x, axis_data, d)
          for x, d in zip(args[n_consts:], dims[n_consts:])]
  carry_dims = [0] * len(init)
  body_batched = _jax_private.batch_jaxpr_axes(
      body_jaxpr, axis_data, bdims + carry_dims, carry_dims)
  cond_batched = _jax_private.batch_jaxpr_axes(
      cond_jaxpr, axis_data, cdims + carry_dims, [0])
  outs = primitives.while_p.bind(
      *args[:n_consts], *init, cond_nconsts=cond_nconsts,
      cond_jaxpr=cond_batched, body_nconsts=body_nconsts,
      body_jaxpr=body_batched)
  return outs, carry_dims


def _spec(aval) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                              weak_type=getattr(aval, "weak_type", False))


def _select_lanes(pred, x, y):
  pred = jax.lax.broadcast_in_dim(pred, x.shape, (0,))
  return jax.lax.select(pred, x, y)


def _select_lanes_n(index, cases):
  index = jax.lax.broadcast_in_dim(index, cases[0].shape, (0,))
  return jax.lax.select_n(index, *cases)
