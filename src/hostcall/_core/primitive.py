"""``hostcall_p``: the primitive under every hostcall flavour, and its rules.

One equation calls one host function. Its parameters:

* ``target``: the ``HostTarget`` that receives the flat operands on the host;
* ``transforms``: the transformations applied so far, as hashable tuples
  (``("batch", batch_dims, axis_size)``), shown to the host function;
* ``identity``: when True (a tap) the results are the operands themselves;
  otherwise they are ``result_avals``, computed by the host;
* ``result_avals``: the shapes and dtypes the host returns (calls only);
* ``mode``: ``"ordered"`` (sequenced with every other ordered hostcall: JAX
  threads a token through the program for it), ``"unordered"`` (never
  elided, free to move), ``"pure"`` (no effect: may be elided, duplicated
  or reordered like any pure operation), or ``"io"`` / ``"io_ordered"``
  (JAX's own io_callback effects, with every rule JAX attaches to them);
* ``device_index``: under a global (``jit``) view of several devices, which
  device of the computation makes the call;
* ``sharding``: None, or a ``SingleDeviceSharding`` naming that device
  (JAX's callbacks' parameter; it wins over ``device_index``);
* ``delivery``: ``"sync"`` (the host function runs inside the computation,
  which waits for it) or ``"async"`` (taps only: the operands are queued and
  a host thread delivers them; see ``asynchronous``);
* ``partitioned``: under a global view of several devices, one call per
  shard with the local shard instead of one call with the gathered value
  (result-less calls only; see ``partitioned``).

The rules, registered at the bottom of this file, in one place: abstract
evaluation, eager evaluation, batching, JVP, transposition (of linear
derivative calls), partial evaluation under ``jax.checkpoint``, and the MLIR
lowering.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.extend.mlir.dialects import stablehlo as hlo
from jax.interpreters import ad, batching, mlir
from jax.interpreters import partial_eval as pe

from hostcall import _jax_private
from hostcall._core import (asynchronous, batched_ad, buffering,
                            control_flow, host, modes)
from hostcall._core import partitioned as partitioned_calls

hostcall_p = jex_core.Primitive("hostcall")
hostcall_p.multiple_results = True


class OrderedHostEffect(jex_core.Effect):
  """Ordered hostcalls: run in program order, never elided or duplicated."""

  __str__ = lambda self: "HostcallOrdered"  # noqa: E731


class UnorderedHostEffect(jex_core.Effect):
  """Unordered hostcalls: never elided, but free to move between each other."""

  __str__ = lambda self: "Hostcall"  # noqa: E731


ORDERED = OrderedHostEffect()
UNORDERED = UnorderedHostEffect()
_jax_private.register_effect(OrderedHostEffect, ordered=True)
_jax_private.register_effect(UnorderedHostEffect, ordered=False)
_jax_private.require_devices_during_lowering(hostcall_p)


def bind(flat_args: Sequence, *, target: host.HostTarget, identity: bool,
         result_avals: tuple = (), mode: str = "ordered",
         device_index: int = 0, sharding=None,
         delivery: str | None = None, partitioned: bool = False) -> list:
  """Stages one host call of ``target`` on ``flat_args``; returns flat results.

  ``sharding``: a ``SingleDeviceSharding`` naming the device that makes the
  call under a global view of several devices (overrides ``device_index``).
  ``delivery``: ``"sync"`` or ``"async"``; None: the mode in force (see
  ``modes``). A call with results is always synchronous.
  ``partitioned``: under a global view of several devices, one call per
  shard instead of one with the gathered value (see ``partitioned``).
  """
  if mode not in _EFFECTS:
    raise ValueError(f"mode must be one of {sorted(_EFFECTS)}, got {mode!r}")
  delivery = modes.current() if delivery is None else modes._check(delivery)
  if delivery == "async" and result_avals:
    delivery = "sync"  # a call with results must wait for them
  if identity or not result_avals:
    if buffering.intercept(flat_args, target, delivery):
      return list(flat_args) if identity else []
  return hostcall_p.bind(
      *flat_args, target=target, transforms=(), identity=identity,
      result_avals=tuple(result_avals), mode=mode,
      device_index=device_index, sharding=sharding, delivery=delivery,
      partitioned=bool(partitioned))


# io callbacks carry JAX's own IO effects, so that every rule JAX applies to
# its io_callback (refused in a vmap of cond or of a while with a batched
# predicate, under checkpoint's partial evaluation, inside custom_jvp) and
# its ordering with JAX's ordered io callbacks apply to them unchanged.
_EFFECTS = {"ordered": ORDERED, "unordered": UNORDERED, "pure": None,
            "io": _jax_private.IO_EFFECT,
            "io_ordered": _jax_private.ORDERED_IO_EFFECT}
_ORDERED_MODES = ("ordered", "io_ordered")


def _abstract_eval(*avals, identity, result_avals, mode, **_):
  outs = avals if identity else result_avals
  effect = _EFFECTS[mode]
  return list(outs), set() if effect is None else {effect}


@functools.lru_cache(maxsize=512)
def _compiled(**params):
  return jax.jit(functools.partial(hostcall_p.bind, **params))


def _impl(*args, **params):
  if jax.config.jax_disable_jit or params["target"].inline_outside_jit:
    return _run_inline(*args, **params)
  # Outside jit we still compile: the host function then runs from the same
  # runtime thread, sequenced by the same effect tokens, as inside jit.
  return _compiled(**params)(*args)


def _run_inline(*args, target, transforms, identity, result_avals, mode,
                device_index, sharding, delivery, partitioned):
  """Called outside ``jit`` (under ``jax.disable_jit()``, or for a debug
  callback, as JAX calls its own): the host function runs right here."""
  del result_avals, mode, device_index, sharding, delivery, partitioned
  devices = [d for a in args if isinstance(a, jax.Array) for d in a.devices()]
  device = devices[0] if devices else jax.devices()[0]
  host_args = [_host_value(a) for a in args]
  results = host.run(target, host_args,
                     host.make_context(transforms, device))
  if identity:
    return list(args)
  return [jax.device_put(r, device) for r in results]


def _host_value(value):
  """What a host function receives for ``value`` outside ``jit``: a NumPy
  array with JAX's dtype (Python numbers narrowed as JAX narrows them), or
  an array of an extended dtype (a PRNG key) as it is."""
  if jax.dtypes.issubdtype(jnp.result_type(value), jax.dtypes.extended):
    return value
  array = np.asarray(value)
  return array.astype(jax.dtypes.canonicalize_dtype(array.dtype), copy=False)


def _batching_rule(args, dims, *, transforms, identity, target, result_avals,
                   **params):
  size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
  if identity:
    # A tap sees the whole batch, told how it is batched.
    entry = ("batch", tuple(dims), size)
    outs = hostcall_p.bind(*args, transforms=transforms + (entry,),
                           identity=identity, target=target,
                           result_avals=result_avals, **params)
    return outs, dims
  method = target.vmap_method()
  if params["partitioned"] and method not in VECTORISED:
    # The batch axis may itself be split over devices: one partitioned call
    # per batch element, as JAX's debug callbacks do.
    for i in range(size):
      hostcall_p.bind(*[a if d is None else jax.lax.index_in_dim(
          a, i, d, keepdims=False) for a, d in zip(args, dims)],
                      transforms=transforms, identity=identity,
                      target=target, result_avals=result_avals, **params)
    return [], []
  if method in VECTORISED:
    # The host function is vectorised: hand it every batch axis in front,
    # unbatched operands given a unit or full leading axis (or, as JAX's
    # "legacy_vectorized" does, left as they are).
    args = [_leading(a, d, size, method) for a, d in zip(args, dims)]
    if method != "legacy_vectorized":
      dims = [0] * len(args)
    else:
      dims = [None if d is None else 0 for d in dims]
  entry = ("batch", tuple(dims), size)
  batched_avals = tuple(
      jax.core.ShapedArray((size, *aval.shape), aval.dtype)
      for aval in result_avals)
  outs = hostcall_p.bind(*args, transforms=transforms + (entry,),
                         identity=identity, target=target,
                         result_avals=batched_avals, **params)
  return outs, [0] * len(outs)


#: vmap methods under which the host function gets the whole batch at once.
VECTORISED = ("expand_dims", "broadcast_all", "legacy_vectorized")


def _leading(x, dim, size, method):
  if dim is not None:
    return jnp.moveaxis(x, dim, 0)
  if method == "broadcast_all":
    return jax.lax.broadcast(x, (size,))
  if method == "legacy_vectorized":
    return x
  return jax.lax.expand_dims(x, (0,))


def _jvp_rule(primals, tangents, *, identity, target, transforms, **params):
  moving = any(type(t) is not ad.Zero for t in tangents)
  if moving and not identity and not target.has_derivatives():
    # Refused before the host function runs, as JAX refuses; a call whose
    # results are constants goes on.
    target.check_differentiable()
  outs = hostcall_p.bind(*primals, identity=identity, target=target,
                         transforms=transforms, **params)
  if identity:
    # Taps see primal values only, once per primal evaluation; tangents flow
    # through as through the identity.
    return outs, list(tangents)
  out_tangents = None
  if moving and target.has_derivatives():
    levels = batched_ad.batch_levels(transforms)
    if levels:
      if target.vmap_method() in ("expand_dims", "legacy_vectorized"):
        raise NotImplementedError(
            f"differentiating {target!r} after vmap with "
            f"vmap_method={target.vmap_method()!r} is not supported: its "
            "unbatched operands do not have the batch axis. Use "
            "'broadcast_all' or 'sequential', or differentiate inside the "
            "vmap.")
      out_tangents = batched_ad.lifted_jvp(target.jvp, levels, list(primals),
                                           list(tangents))
    else:
      out_tangents = target.jvp(primals, tangents)
  if out_tangents is None:
    out_tangents = [ad.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]
  return outs, list(out_tangents)


def _transpose_rule(cts, *args, target, transforms, identity, **params):
  if identity:
    # A tap is linear in what it taps (it is the identity): under reverse
    # mode, a tap of tangents becomes a tap of their cotangents, told so by
    # a "transpose" entry, as in the legacy module; a tap whose result
    # nothing used has no cotangent to show, and the legacy module dropped
    # it.
    if all(type(c) is ad.Zero for c in cts):
      return [None] * len(args)
    cts = [batched_ad.instantiate(c) if type(c) is ad.Zero else c
           for c in cts]
    outs = hostcall_p.bind(*cts, target=target, identity=True,
                           transforms=transforms + (("transpose",),),
                           **params)
    return [o if ad.is_undefined_primal(a) else None
            for o, a in zip(outs, args)]
  levels = batched_ad.batch_levels(transforms)
  if levels:
    return batched_ad.lifted_transpose(target.transpose, levels, list(cts),
                                       args)
  return target.transpose(cts, args)


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


def _device_resolver(ctx, device_index: int):
  """How the host learns which device called: a constant or an operand."""
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _jax_private.SPMDAxisContext):
    mesh = axis_context.mesh
    devices = tuple(getattr(mesh, "devices", np.array([])).flat)
    partition = hlo.partition_id()
    return devices, partition
  assignment = getattr(axis_context, "device_assignment", None) or ()
  if not assignment:
    backend = ctx.module_context.get_backend()
    assignment = tuple(backend.local_devices())
  if len(assignment) > 1 and not 0 <= device_index < len(assignment):
    raise ValueError(
        f"device_index={device_index} is out of range: the computation runs "
        f"on {len(assignment)} devices; pass 0 <= device_index < "
        f"{len(assignment)}.")
  device = assignment[device_index] if len(assignment) > 1 else assignment[0]
  return device, None


def _lowering(ctx, *args, target, transforms, identity, result_avals, mode,
              device_index, sharding, delivery, partitioned):
  devices, partition = _device_resolver(ctx, device_index)
  axis_context = ctx.module_context.axis_context
  chosen = None
  global_view = (isinstance(axis_context, _jax_private.ShardingContext)
                 and axis_context.num_devices > 1)
  if global_view and partitioned and not result_avals:
    _lower_partitioned(ctx, args, target, transforms, mode, delivery)
    return list(args) if identity else []
  if global_view:
    # Global view of several devices: one call, made by the chosen device.
    chosen = sharding or jax.sharding.SingleDeviceSharding(devices)
    devices = next(iter(chosen.device_set))
  operands, operand_avals = list(args), list(ctx.avals_in)
  if partition is not None:
    # One call per device: the device is told by its partition id.
    contexts = [host.make_context(transforms, d) for d in devices]
    operands.append(partition)
    operand_avals.append(jax.core.ShapedArray((), np.uint32))
  else:
    contexts = host.make_context(transforms, devices)
  op_sharding = _jax_private.callback_op_sharding(
      axis_context, chosen, result_avals)
  effect = _EFFECTS[mode]
  ordered = mode in _ORDERED_MODES
  token = ctx.tokens_in.get(effect) if ordered else None
  if delivery == "async":
    token = _lower_enqueue(ctx, target, contexts, token, operands,
                           operand_avals, op_sharding)
    results = []
  else:
    results, token = _lower_python_call(ctx, target, contexts, token,
                                        operands, operand_avals, result_avals,
                                        op_sharding, effect)
  if ordered:
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(
        mlir.TokenSet({effect: token})))
  if chosen is not None:
    results = [_jax_private.replicated(ctx, r, a)
               for r, a in zip(results, result_avals)]
  return list(args) if identity else list(results)


def _lower_partitioned(ctx, args, target, transforms, mode, delivery):
  """One call per shard; no token can ride along (see ``partitioned``)."""
  axis_context = ctx.module_context.axis_context
  operands, operand_avals = partitioned_calls.operands(
      ctx, args, ctx.avals_in, axis_context.num_devices)
  unpack = functools.partial(
      partitioned_calls.unpack, global_avals=list(ctx.avals_in),
      devices=tuple(axis_context.device_assignment), transforms=transforms)
  if delivery == "async":
    site = asynchronous.sites.add(target, unpack)

    def callback(*flat):
      asynchronous.delivery.push(site, list(flat))
      return ()
  else:
    def callback(*flat):
      unpacked = unpack(flat)
      if unpacked is not None:
        host.run(target, *unpacked)
      return ()

  mlir.emit_python_callback(
      ctx.replace(avals_in=operand_avals, avals_out=[]), callback, None,
      operands, operand_avals, [], has_side_effect=True, returns_token=False,
      partitioned=True)
  effect = _EFFECTS[mode]
  if mode in _ORDERED_MODES:  # passes the order through, unused
    ctx.set_tokens_out(ctx.tokens_in)


def _lower_python_call(ctx, target, contexts, token, operands, operand_avals,
                       result_avals, op_sharding, effect):
  """The host function runs in the computation's thread, which waits."""
  if isinstance(contexts, list):
    def callback(*flat):
      *flat, pid = flat
      return host.run(target, flat, contexts[int(pid)])
  else:
    def callback(*flat):
      return host.run(target, flat, contexts)

  call_ctx = ctx.replace(avals_in=operand_avals, avals_out=list(result_avals))
  results, token, _ = mlir.emit_python_callback(
      call_ctx, callback, token, operands, operand_avals, list(result_avals),
      has_side_effect=effect is not None, returns_token=token is not None,
      sharding=op_sharding)
  return results, token


def _lower_enqueue(ctx, target, contexts, token, operands, operand_avals,
                   op_sharding):
  """The operands are queued for the consumer thread; nothing waits."""
  axis_context = ctx.module_context.axis_context
  global_view = (isinstance(axis_context, _jax_private.ShardingContext)
                 and axis_context.num_devices > 1)
  # XLA's partitioner drops the sharding of our custom call under a global
  # view of several devices, and the native handler is built for CPU
  # buffers only: there the Python callback queues instead.
  on_cpu = list(ctx.module_context.platforms) == ["cpu"]
  layouts = asynchronous.layouts_of(operand_avals)
  if (layouts is None or global_view or not on_cpu
      or not asynchronous.delivery.native):
    site = asynchronous.sites.add(target, contexts)

    def callback(*flat):
      asynchronous.delivery.push(site, list(flat))
      return ()
    call_ctx = ctx.replace(avals_in=operand_avals, avals_out=[])
    _, token, _ = mlir.emit_python_callback(
        call_ctx, callback, token, operands, operand_avals, [],
        has_side_effect=True, returns_token=token is not None,
        sharding=op_sharding)
    return token
  site = asynchronous.sites.add(target, contexts, layouts)
  if token is not None:
    name = "hostcall_enqueue_ordered"
    operands = [token, *operands]
    avals_in = [_jax_private.abstract_token, *operand_avals]
    avals_out = [_jax_private.abstract_token]
  else:
    name, avals_in, avals_out = "hostcall_enqueue", operand_avals, []
  op = jax.ffi.build_ffi_lowering_function(name, has_side_effect=True)(
      ctx.replace(avals_in=avals_in, avals_out=avals_out), *operands,
      site=np.int64(site),
      nbytes=np.array([layout.nbytes for layout in layouts], np.int64))
  if op_sharding is not None:
    _jax_private.set_sharding(ctx.module_context, op, op_sharding)
  return op.results[0] if token is not None else None


hostcall_p.def_effectful_abstract_eval(_abstract_eval)
hostcall_p.def_impl(_impl)
batching.primitive_batchers[hostcall_p] = _batching_rule
ad.primitive_jvps[hostcall_p] = _jvp_rule
ad.primitive_transposes[hostcall_p] = _transpose_rule
pe.partial_eval_jaxpr_custom_rules[hostcall_p] = _remat_rule
mlir.register_lowering(hostcall_p, _lowering, cacheable=False)
control_flow.install((OrderedHostEffect, UnorderedHostEffect))
