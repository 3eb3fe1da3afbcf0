"""``hostcall_p``: the primitive under every hostcall flavour, and its rules.

One equation calls one host function. Its parameters:

* ``target``: the ``HostTarget`` that receives the flat operands on the host
  (see ``targets``);
* ``kind``: ``"tap"``, whose results are its operands, passed through (the
  legacy ``id_tap``), or ``"call"``, whose results are ``result_avals``,
  computed by the host;
* ``result_avals``: the shapes and dtypes the host returns (calls only);
* ``transforms``: the transformations applied so far, as hashable tuples
  (``("batch", batch_dims, axis_size)``, ``("transpose",)``), shown to the
  host function;
* ``ordering``: the call's effect (``"ordered"``, ``"unordered"``,
  ``"pure"``, ``"io"``, ``"io_ordered"``; see ``effects``);
* ``device_index``: under a global (``jit``) view of several devices, which
  device of the computation makes the call;
* ``sharding``: None, or a ``SingleDeviceSharding`` naming that device
  (JAX's callbacks' parameter; it wins over ``device_index``);
* ``delivery``: ``"sync"`` (the host function runs inside the computation,
  which waits for it) or ``"async"`` (result-less calls: the operands are
  queued and a host thread delivers them; see ``hostcall._runtime``);
* ``partitioned``: under a global view of several devices, one call per
  shard with the local shard instead of one call with the gathered value
  (result-less calls; see ``partitioned``).

Its rules, each registered where it is defined (as JAX's
``_src/callback.py`` registers its callbacks'), in one of three modules:

================  ==========================================================
rule              where it is registered
================  ==========================================================
abstract eval     here: ``_abstract_eval`` (``def_effectful_abstract_eval``;
                  its effect: ``effects.effect_of``)
impl (eager)      ``hostcall._runtime.eager``: ``_impl`` (``def_impl``)
lowering          ``hostcall._runtime.lowering``: ``lower``, one rule for
                  every platform (``register_lowering``, not cacheable; the
                  platform decides the emission there: ``emission.route``)
devices           here: ``require_devices_during_lowering`` (the lowering is
                  handed the program's devices)
batching          here: ``_batching_rule`` (``primitive_batchers``)
JVP               here: ``_jvp_rule`` (``primitive_jvps``)
transpose         here: ``_transpose_rule`` (``primitive_transposes``)
partial eval /    here: ``_remat_rule`` (``partial_eval_jaxpr_custom_rules``;
checkpoint        ``jax.checkpoint``'s split, by the target's ``remat``)
DCE               none: JAX's default, which keeps an equation with an
                  effect and drops an unused ``"pure"`` one
================  ==========================================================

The rules of JAX's own primitives that hostcall replaces for its calls'
sake (``while`` and ``cond`` batching, ``scan`` hoisting, ``while``'s
partial evaluation, ...) are installed by ``jax_rules``, and only there.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
from jax.extend import core as jex_core

from hostcall import _jax_private
from hostcall._core import collecting, delivery as deliveries, lifting
from hostcall._core.context import batch_levels
from hostcall._core.effects import effect_of
from hostcall._core.targets import VECTORISED, HostTarget
from hostcall._core.tangents import instantiate

hostcall_p = jex_core.Primitive("hostcall")
hostcall_p.multiple_results = True
_jax_private.require_devices_during_lowering(hostcall_p)

_KINDS = ("tap", "call")


def bind(flat_args: Sequence, *, target: HostTarget, kind: str,
         result_avals: tuple = (), ordering: str = "ordered",
         device_index: int = 0, sharding=None,
         delivery: str | None = None, partitioned: bool = False) -> list:
  """Stages one host call of ``target`` on ``flat_args``; returns flat results.

  Arguments:
    flat_args: the operands (arrays, tracers or Python numbers).
    target: the ``HostTarget`` that receives them on the host.
    kind: ``"tap"`` (returns ``flat_args``) or ``"call"`` (returns results
      of ``result_avals``).
    result_avals: a call's results' abstract values.
    ordering: the call's effect; see ``effects``.
    device_index, sharding: which device calls, under a global view of
      several devices.
    delivery: ``"sync"`` or ``"async"``; None: the one the target asks for
      (``Schedule.delivery``), else the one in force (see
      ``hostcall.set_delivery``). A call with results is always synchronous.
    partitioned: one call per shard instead of one with the gathered value.

  Returns:
    The flat results.
  """
  if kind not in _KINDS:
    raise ValueError(f"kind must be one of {_KINDS}, got {kind!r}")
  effect_of(ordering)  # refuses an unknown ordering
  if delivery is None:  # the target's own, else the one in force
    delivery = target.schedule.delivery
  delivery = (deliveries.current() if delivery is None
              else deliveries.check(delivery))
  if delivery == "async" and result_avals:
    delivery = "sync"  # a call with results must wait for them
  if kind == "tap" or not result_avals:
    if collecting.intercept(flat_args, target, delivery, ordering):
      return list(flat_args) if kind == "tap" else []
  return hostcall_p.bind(
      *flat_args, target=target, transforms=(), kind=kind,
      result_avals=tuple(result_avals), ordering=ordering,
      device_index=device_index, sharding=sharding, delivery=delivery,
      partitioned=bool(partitioned))


def _abstract_eval(*avals, kind, result_avals, ordering, **_):
  effect = effect_of(ordering)
  outs = avals if kind == "tap" else result_avals
  return list(outs), set() if effect is None else {effect}


hostcall_p.def_effectful_abstract_eval(_abstract_eval)


def _batching_rule(args, dims, *, transforms, kind, target, result_avals,
                   **params):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  rebind = functools.partial(hostcall_p.bind, kind=kind, target=target,
                             **params)
  if kind == "tap":
    # A tap sees the whole batch, told how it is batched.
    outs = rebind(*args, transforms=transforms + (("batch", tuple(dims),
                                                   size),),
                  result_avals=result_avals)
    return outs, dims
  method = target.vmap_method()
  if params["partitioned"] and method not in VECTORISED:
    # The batch axis may itself be split over devices: one partitioned call
    # per batch element, as JAX's debug callbacks do.
    for i in range(size):
      rebind(*[a if d is None else jax.lax.index_in_dim(a, i, d,
                                                        keepdims=False)
               for a, d in zip(args, dims)],
             transforms=transforms, result_avals=result_avals)
    return [], []
  if method in VECTORISED:
    # The host function is vectorised: hand it every batch axis in front,
    # unbatched operands given a unit or full leading axis (or, as JAX's
    # "legacy_vectorized" does, left as they are).
    args = [_leading(a, d, size, method) for a, d in zip(args, dims)]
    dims = ([None if d is None else 0 for d in dims]
            if method == "legacy_vectorized" else [0] * len(args))
  batched_avals = tuple(_jax_private.ShapedArray((size, *a.shape), a.dtype)
                        for a in result_avals)
  outs = rebind(*args, transforms=transforms + (("batch", tuple(dims), size),),
                result_avals=batched_avals)
  return outs, [0] * len(outs)


_jax_private.primitive_batchers[hostcall_p] = _batching_rule


def _leading(x, dim, size, method):
  if dim is not None:
    return jnp.moveaxis(x, dim, 0)
  if method == "broadcast_all":
    return jax.lax.broadcast(x, (size,))
  if method == "legacy_vectorized":
    return x
  return jax.lax.expand_dims(x, (0,))


def _jvp_rule(primals, tangents, *, kind, target, transforms, **params):
  moving = any(type(t) is not _jax_private.Zero for t in tangents)
  if moving and kind == "call" and not target.has_derivatives():
    # Refused before the host function runs, as JAX refuses; a call whose
    # results are constants goes on.
    target.check_differentiable()
  outs = hostcall_p.bind(*primals, kind=kind, target=target,
                         transforms=transforms, **params)
  if kind == "tap":
    # Taps see primal values only, once per primal evaluation; tangents flow
    # through as through the identity.
    return outs, list(tangents)
  out_tangents = None
  if moving and target.has_derivatives():
    levels = batch_levels(transforms)
    if levels:
      if target.vmap_method() in ("expand_dims", "legacy_vectorized"):
        raise NotImplementedError(
            f"differentiating {target!r} after vmap with "
            f"vmap_method={target.vmap_method()!r} is not supported: its "
            "unbatched operands do not have the batch axis. Use "
            "'broadcast_all' or 'sequential', or differentiate inside the "
            "vmap.")
      out_tangents = lifting.lifted_jvp(target.jvp, levels, list(primals),
                                        list(tangents))
    else:
      out_tangents = target.jvp(primals, tangents)
  if out_tangents is None:
    out_tangents = [_jax_private.Zero(jax.typeof(o).to_tangent_aval())
                    for o in outs]
  return outs, list(out_tangents)


_jax_private.primitive_jvps[hostcall_p] = _jvp_rule


def _transpose_rule(cts, *args, target, transforms, kind, **params):
  if kind == "tap":
    # A tap is linear in what it taps (it is the identity): under reverse
    # mode, a tap of tangents becomes a tap of their cotangents, told so by
    # a "transpose" entry, as in the legacy module; a tap whose result
    # nothing used has no cotangent to show, and the legacy module dropped
    # it.
    if all(type(c) is _jax_private.Zero for c in cts):
      return [None] * len(args)
    cts = [instantiate(c) if type(c) is _jax_private.Zero else c
           for c in cts]
    outs = hostcall_p.bind(*cts, target=target, kind=kind,
                           transforms=transforms + (("transpose",),),
                           **params)
    return [o if _jax_private.is_undefined_primal(a) else None
            for o, a in zip(outs, args)]
  levels = batch_levels(transforms)
  if levels:
    outs = lifting.lifted_transpose(target.transpose, levels, list(cts), args)
  else:
    outs = target.transpose(cts, args)
  return [_varying_as(o, a) for o, a in zip(outs, args)]


_jax_private.primitive_transposes[hostcall_p] = _transpose_rule


def _varying_as(cotangent, arg):
  """``cotangent`` varying over the ``shard_map`` axes ``arg`` varies over
  (a host rule's result varies over none, and JAX checks a cotangent's
  type against its primal's)."""
  if cotangent is None or not _jax_private.is_undefined_primal(arg):
    return cotangent
  wanted = _jax_private.varying_axes(arg.aval)
  if not wanted or isinstance(cotangent, _jax_private.Zero):
    return cotangent
  missing = tuple(sorted(
      wanted - _jax_private.varying_axes(jax.typeof(cotangent))))
  return _jax_private.made_varying(cotangent, missing)


def _remat_rule(saveable, unks_in, inst_in, eqn):
  # Under jax.checkpoint, a tap whose inputs are known runs in the forward
  # pass and runs again where the backward pass rematerialises its inputs, as
  # the legacy host_callback documented. Outside checkpoint every value is
  # saveable and the tap runs once.
  remat = eqn.params["target"].remat
  if remat == "debug":
    return _debug_remat_rule(saveable, unks_in, inst_in, eqn)
  n_out = len(eqn.outvars)
  residuals = [v for v, inst in zip(eqn.invars, inst_in)
               if isinstance(v, jex_core.Var) and not inst]
  if any(unks_in):
    return None, eqn, [True] * n_out, [True] * n_out, residuals
  if remat == "once":
    return eqn, None, [False] * n_out, [False] * n_out, []
  policy = saveable(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params)
  if not _jax_private.is_recompute_policy(policy):
    return eqn, None, [False] * n_out, [False] * n_out, []
  return eqn, eqn, [False] * n_out, [True] * n_out, residuals


_jax_private.partial_eval_jaxpr_custom_rules[hostcall_p] = _remat_rule


def _debug_remat_rule(saveable, unks_in, inst_in, eqn):
  # jax.debug.callback's rule, so that debug callbacks run exactly as often
  # as JAX's under every checkpoint policy: staged in the backward pass too
  # unless the policy saves them and not all their inputs are available.
  if any(unks_in):
    residuals = [v for v, inst in zip(eqn.invars, inst_in) if not inst]
    return None, eqn, [], [], residuals
  if saveable(eqn.primitive, *[v.aval for v in eqn.invars], **eqn.params):
    return (eqn, eqn, [], [], []) if all(inst_in) else (eqn, None, [], [], [])
  return eqn, eqn, [], [], []
