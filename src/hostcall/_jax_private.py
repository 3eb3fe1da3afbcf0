"""Every private JAX name hostcall relies on, gathered in one place.

JAX's public API has no way to declare a new side effect that may appear inside
``scan``/``while``/``cond``, ``custom_jvp``/``custom_vjp`` and ``checkpoint``,
nor to reuse the sharding that JAX's own callbacks attach to their custom call.
Those few names live in ``jax._src``; importing them anywhere else is forbidden
by convention, and ``tests/test_jax_private.py`` fails loudly when one of them
moves or changes shape in a new JAX release.
"""

from __future__ import annotations

from jax._src import callback as _callback
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import effects as _effects
from jax._src import config as _config
from jax._src import named_sharding as _named_sharding
from jax._src import shard_alike as _shard_alike
from jax._src import traceback_util as _traceback_util
from jax._src import sharding_impls as _sharding_impls
from jax._src.lib import xla_client as _xc
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import mlir as _mlir
from jax._src.interpreters import partial_eval as _pe

#: Axis context of a ``shard_map`` body (manual, per-device semantics).
SPMDAxisContext = _sharding_impls.SPMDAxisContext
#: Axis context of a ``jit`` over one or more devices (global semantics).
ShardingContext = _sharding_impls.ShardingContext

#: ``callback_op_sharding(axis_context, sharding, avals_out)``: the op sharding
#: JAX gives its own callbacks (MAXIMAL on one device under ``jit``, MANUAL
#: under ``shard_map``), or None on one device.
callback_op_sharding = _callback._callback_op_sharding


#: ``set_sharding(module_context, op, sharding)``: annotate a custom call we
#: emit ourselves with the sharding ``callback_op_sharding`` chose.
set_sharding = _mlir.set_sharding


def replicated(ctx, value, aval):
  """``value`` annotated as replicated on every device of a global view.

  A callback's result lives on the one device that made the call; without
  this, XLA leaves it there (a "maximal" array that reads as zeros from any
  other device and that later computations refuse).
  """
  if _config.use_shardy_partitioner.value:
    sharding = _named_sharding.SdyArray(
        mesh_shape=None, dim_shardings=tuple(
            _named_sharding.SdyDim(axes=(), is_open=True)
            for _ in range(aval.ndim)))
  else:
    sharding = _xc.HloSharding.replicate().to_proto()
  return _mlir.wrap_with_sharding_op(ctx, value, aval, sharding)


def shard_alike(ctx, x, y, x_aval, y_aval):
  """``y``, kept in one sharding group with ``x`` (what
  ``jax.experimental.shard_alike`` lowers to), so XLA shards them alike."""
  return _shard_alike._group_shard(ctx, x, y, x_aval, y_aval)[1]


def split_over_devices(ctx, value, aval, num_devices: int):
  """``value`` (of shape ``(num_devices,)``) annotated so that device ``k``
  of the computation holds element ``k``."""
  if _config.use_shardy_partitioner.value:
    sharding = _named_sharding.SdyArray(
        mesh_shape=(("_hostcall_devices", num_devices),),
        dim_shardings=(_named_sharding.SdyDim(
            axes=("_hostcall_devices",), is_open=False),),
        logical_device_ids=None)
  else:
    sharding = _xc.OpSharding()
    sharding.type = _xc.OpSharding.Type.OTHER
    sharding.tile_assignment_dimensions = [num_devices]
    sharding.tile_assignment_devices = list(range(num_devices))
  return _mlir.wrap_with_sharding_op(ctx, value, aval, sharding)


#: The token aval, compared by identity when lowering custom calls.
abstract_token = _core.abstract_token

#: ``batch_jaxpr_axes(closed_jaxpr, axis_data, in_axes, out_axes_dest)``:
#: a jaxpr batched as a batching rule's operands are (``axis_data`` is the
#: rule's own), outputs moved to ``out_axes_dest``; returns ``(jaxpr, _)``.
def batch_jaxpr_axes(closed_jaxpr, axis_data, in_axes, out_axes_dest):
  return _batching.batch_jaxpr_axes(closed_jaxpr, axis_data, in_axes,
                                    out_axes_dest)[0]


#: ``batch_jaxpr(closed_jaxpr, axis_data, in_batched, instantiate)``:
#: ``(jaxpr, out_batched)``, as JAX's control-flow batching rules use it.
batch_jaxpr = _batching.batch_jaxpr


def broadcast_batched(x, axis_data, dim):
  """``x`` (batched at ``dim``, or not at all when None) batched at 0."""
  if dim is None:
    return _batching.broadcast(x, axis_data.size, 0,
                               axis_data.explicit_mesh_axis)
  return _batching.moveaxis(x, dim, 0)


#: ``jax.experimental.io_callback``'s effects (unordered, ordered). JAX's
#: rules for io callbacks test for these very objects: vmap of ``cond`` and of
#: a ``while_loop`` with a batched predicate refuse them, ``checkpoint``'s
#: partial evaluation and ``custom_jvp`` do not allow them.
IO_EFFECT = _callback._IOEffect
ORDERED_IO_EFFECT = _callback._OrderedIOEffect


def register_effect(effect_type: type, *, ordered: bool) -> None:
  """Declares ``effect_type`` legal everywhere a JAX callback effect is."""
  for registry in (
      _effects.lowerable_effects,
      _effects.control_flow_allowed_effects,
      _effects.custom_derivatives_allowed_effects,
      _effects.remat_allowed_effects,
      # Kept through partial evaluation (grad of a loop body), as JAX keeps
      # its debug callbacks.
      _effects.partial_eval_kept_effects,
  ):
    registry.add_type(effect_type)
  if ordered:
    _effects.ordered_effects.add_type(effect_type)
    _effects.shardable_ordered_effects.add_type(effect_type)


def require_devices_during_lowering(primitive) -> None:
  """Makes JAX hand the concrete device assignment to ``primitive``'s lowering."""
  _dispatch.prim_requires_devices_during_lowering.add(primitive)


def is_recompute_policy(policy) -> bool:
  """Whether a ``jax.checkpoint`` policy's answer means "recompute, don't save"."""
  return isinstance(_pe.ensure_enum(policy), _pe.RecomputeType)


def hide_frames_of(directory: str) -> None:
  """Leaves the frames of files under ``directory`` out of the tracebacks
  JAX filters (``JAX_TRACEBACK_FILTERING``), as JAX leaves out its own: an
  error raised while tracing a user's function points at that function."""
  _traceback_util.register_exclusion(directory)


def trace_of(value):
  """The trace a tracer belongs to (None for a concrete value)."""
  return getattr(value, "_trace", None)
