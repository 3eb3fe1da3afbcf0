"""The MLIR lowering of ``hostcall_p``: where the host function is called.

``lower`` is the primitive's lowering rule. It learns (``emission``) which
device makes the call (a constant on one device or under ``jit``'s global
view, where one chosen device calls; the partition id under ``shard_map``,
one call per device), threads the ordering token of ordered calls, and
emits one of:

* a synchronous call: JAX's runtime Python callback, which runs the host
  function while the computation waits (``emit_sync``);
* an asynchronous one: the operands are queued for the consumer thread
  (``hostcall._runtime.enqueue``);
* a partitioned one: one call per shard (``emit_partitioned``, see
  ``partitioned``).

Results of a call made by one device of a global view are marked
replicated, so that every device reads them.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from hostcall import _jax_private
from hostcall._core.context import AFTER, make_context
from hostcall._core.effects import ORDERED, effect_of
from hostcall._core.primitive import hostcall_p
from hostcall._runtime import (call_sites, calls, dispatch_hint, emission,
                               enqueue, partitioned, tap_queue)


def lower(ctx, *args, target, transforms, kind, result_avals, ordering,
          device_index, sharding, delivery, partitioned):
  """The lowering rule of ``hostcall_p`` (its parameters: see
  ``primitive``)."""
  axis_context = ctx.module_context.axis_context
  passed_through = list(args) if kind == "tap" else []
  tally = dispatch_hint.tally_for(
      ctx, target, answers=kind == "call" and bool(result_avals),
      per_device=partitioned or isinstance(axis_context,
                                           _jax_private.SPMDAxisContext))
  if emission.global_view(axis_context) and partitioned and not result_avals:
    emit_partitioned(ctx, args, target, transforms, ordering, delivery)
    return passed_through
  devices, partition = emission.caller(ctx, device_index)
  chosen = None
  if emission.global_view(axis_context):
    # One call, made by the chosen device.
    chosen = sharding or jax.sharding.SingleDeviceSharding(devices)
    devices = next(iter(chosen.device_set))
  operands, operand_avals = list(args), list(ctx.avals_in)
  if partition is not None:
    contexts = [make_context(transforms, d, peers=devices, axis_indices=at)
                for d, at in zip(devices, emission.mesh_indices(ctx))]
    operands.append(partition)
    operand_avals.append(_jax_private.ShapedArray((), np.uint32))
  else:
    # A queued call's runs are counted where they are delivered.
    contexts = make_context(transforms, devices,
                            tally=tally if delivery == "async" else None)
  op_sharding = emission.op_sharding(axis_context, chosen, result_avals)
  effect = effect_of(ordering)
  token = ctx.tokens_in.get(effect) if ordering in ORDERED else None
  if delivery == "async":
    token = enqueue.emit(ctx, target, contexts, token, operands,
                         operand_avals, op_sharding)
    results = []
  else:
    results, token = emit_sync(ctx, target, contexts, token, operands,
                               operand_avals, result_avals, op_sharding,
                               has_side_effect=effect is not None,
                               after=AFTER in transforms, tally=tally)
  if ordering in ORDERED:
    if op_sharding is not None:
      token = emission.detached_token(token)
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(
        _jax_private.TokenSet({effect: token})))
  if chosen is not None:
    results = [_jax_private.replicated(ctx, r, a)
               for r, a in zip(results, result_avals)]
  return passed_through if kind == "tap" else list(results)


def _sync_callback(target, contexts, result_avals, after: bool,
                   tally: dispatch_hint.Tally | None = None):
  """The runtime callback of a synchronous call site (``after``: its last
  operand only ordered it, and is dropped; ``tally``: the runs of its
  program it counts, see ``dispatch_hint``)."""
  callback = _plain_sync_callback(target, contexts, result_avals, after)
  if tally is None:
    return callback  # (no wrapper: most sites pay nothing)
  add = tally.add

  def counted(*flat):
    add()
    return callback(*flat)
  return counted


def _plain_sync_callback(target, contexts, result_avals, after: bool):
  if isinstance(contexts, list):  # shard_map: the last operand names the
    def callback(*flat):          # calling device
      *flat, partition = flat
      return calls.run(target, flat[:-1] if after else flat,
                       contexts[int(partition)], result_avals=result_avals)
  elif after:
    def callback(*flat):
      return calls.run(target, flat[:-1], contexts,
                       result_avals=result_avals)
  else:
    def callback(*flat):
      return calls.run(target, flat, contexts, result_avals=result_avals)
  return callback


def emit_sync(ctx, target, contexts, token, operands, operand_avals,
              result_avals, op_sharding, *, has_side_effect: bool,
              after: bool = False, tally=None):
  """Emits a call that runs the host function while the computation waits;
  returns ``(results, token)``."""
  call_ctx = ctx.replace(avals_in=operand_avals, avals_out=list(result_avals))
  callback = _sync_callback(target, contexts, tuple(result_avals), after,
                            tally)
  results, token, _ = _jax_private.emit_python_callback(
      call_ctx, callback, token, operands, operand_avals, list(result_avals),
      has_side_effect=has_side_effect, returns_token=token is not None,
      sharding=op_sharding)
  return results, token


def emit_threaded_live(ctx, target, transforms, device_index: int, order,
                       operands, result_avals) -> list:
  """Emits a call that runs the host function while the computation waits
  (as ``emit_sync``), ordered by the value ``order`` instead of a JAX
  effect (``hostcall._jit.threaded``); returns the value the next call
  takes, then the call's results."""
  order_aval, *operand_avals = ctx.avals_in
  device, _ = emission.caller(ctx, device_index)
  run = _sync_callback(target, make_context(transforms, device),
                       tuple(result_avals), after=False)
  zero = np.zeros((), np.uint8)

  def callback(_, *flat):
    return (zero, *run(*flat))

  results, _, _ = _jax_private.emit_python_callback(
      ctx, callback, None, [order, *operands], [order_aval, *operand_avals],
      [order_aval, *result_avals], has_side_effect=True,
      returns_token=False)
  return list(results)


def emit_partitioned(ctx, args, target, transforms, ordering, delivery):
  """Emits one call per shard. No token can ride along: the call is
  unordered, and an ordered caller's token passes through unused."""
  axis_context = ctx.module_context.axis_context
  operands, operand_avals = partitioned.operands(
      ctx, args, ctx.avals_in, axis_context.num_devices)
  unpack = functools.partial(
      partitioned.unpack, global_avals=list(ctx.avals_in),
      devices=tuple(axis_context.device_assignment), transforms=transforms)
  if delivery == "async":
    tap_queue.consumer.start()
    callback = enqueue.push_callback(
        call_sites.sites.add(target, unpack))
  else:
    def callback(*flat):
      unpacked = unpack(flat)
      if unpacked is not None:
        calls.run(target, *unpacked)
      return ()
  _jax_private.emit_python_callback(
      ctx.replace(avals_in=operand_avals, avals_out=[]), callback, None,
      operands, operand_avals, [], has_side_effect=True, returns_token=False,
      partitioned=True)
  if ordering in ORDERED:
    ctx.set_tokens_out(ctx.tokens_in)


_jax_private.register_lowering(hostcall_p, lower, cacheable=False)
