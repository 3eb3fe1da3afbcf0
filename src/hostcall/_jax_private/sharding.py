"""Shardings, devices and axes: the sharding JAX gives its own callbacks,
annotations hostcall's lowering adds, the executable's keep-alives, and
``jax.distributed``'s coordination client."""

from __future__ import annotations

import inspect
import itertools
import re

from jax.extend.mlir.dialects import sdy as _sdy
from jax._src import callback as _callback
from jax._src import config as _config
from jax._src import core as _core
from jax._src import dispatch as _dispatch
from jax._src import distributed as _distributed
from jax._src import named_sharding as _named_sharding
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _private_mlir
from jax._src.lib import xla_client as _xc

try:  # gone from JAX 0.11.2, with ``jax.experimental.shard_alike``
  from jax._src import shard_alike as _shard_alike
except ImportError:
  _shard_alike = None


#: Axis context of a ``shard_map`` body (manual, per-device semantics).
SPMDAxisContext = _sharding_impls.SPMDAxisContext
#: Axis context of a ``jit`` over one or more devices (global semantics).
ShardingContext = _sharding_impls.ShardingContext

#: ``callback_op_sharding(axis_context, sharding, avals_out)``: the op sharding
#: JAX gives its own callbacks (MAXIMAL on one device under ``jit``, MANUAL
#: under ``shard_map``), or None on one device.
callback_op_sharding = _callback._callback_op_sharding

# Before JAX 0.10, ``set_sharding(op, sharding)``, without the context.
_SET_SHARDING_TAKES_CONTEXT = len(
    inspect.signature(_private_mlir.set_sharding).parameters) == 3


def set_sharding(module_context, op, sharding) -> None:
  """Annotates a custom call we emit ourselves with the sharding
  ``callback_op_sharding`` chose."""
  if _SET_SHARDING_TAKES_CONTEXT:
    _private_mlir.set_sharding(module_context, op, sharding)
  else:
    _private_mlir.set_sharding(op, sharding)


def keep_with_executable(ctx, obj) -> None:
  """Makes the Python executable compiled from the module being lowered
  own ``obj`` (``keepalives``), and release it with itself.

  Not ``host_callbacks``, which the runtime executable would own: on CPU a
  program with host callbacks runs synchronously, so that every call
  carrying a queued tap would wait for its program to end (measured: a
  2000-step scan's call returned after 100% of its run instead of 5%).
  The Python executable may go before a computation it started ends (or,
  for a program JAX's C++ dispatch keeps, while that still runs it):
  ``hostcall._runtime.call_sites.sites`` forgets a released site only after a
  barrier has waited for what was dispatched before the release."""
  keepalives = getattr(ctx.module_context, "keepalives", None)
  if keepalives is None:  # a JAX without them: owned, but synchronously
    ctx.module_context.add_host_callback(obj)
  else:
    keepalives.append(obj)


#: The token aval, compared by identity when lowering custom calls.
abstract_token = _core.abstract_token


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
  return _private_mlir.wrap_with_sharding_op(ctx, value, aval, sharding)


#: Sharding group ids, where JAX has no ``shard_alike`` counting them.
_shard_group_ids = itertools.count()


def shard_alike(ctx, x, y, x_aval, y_aval):
  """``y``, kept in one sharding group with ``x`` (what
  ``jax.experimental.shard_alike`` lowers to), so XLA shards them alike."""
  if _shard_alike is not None:  # JAX's, whose group ids its own calls share
    return _shard_alike._group_shard(ctx, x, y, x_aval, y_aval)[1]
  # From JAX 0.11.2, the same annotations (JAX's ``_group_shard`` of 0.11.1).
  group = next(_shard_group_ids)
  if _config.use_shardy_partitioner.value:
    _sdy.sharding_group(x, group)
    _sdy.sharding_group(y, group)
    return y
  sharding = _xc.OpSharding()
  sharding.type = _xc.OpSharding.Type.UNKNOWN
  sharding.is_shard_group = True
  sharding.shard_group_id = group
  sharding.shard_group_type = _xc.OpSharding.ShardGroupType.AS
  _private_mlir.wrap_with_sharding_op(ctx, x, x_aval, sharding,
                                      has_side_effect=True)
  return _private_mlir.wrap_with_sharding_op(ctx, y, y_aval, sharding,
                                             has_side_effect=True)


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
  return _private_mlir.wrap_with_sharding_op(ctx, value, aval, sharding)


def require_devices_during_lowering(primitive) -> None:
  """Makes JAX hand the concrete device assignment to ``primitive``'s
  lowering."""
  _dispatch.prim_requires_devices_during_lowering.add(primitive)


def collective_axis_names() -> tuple:
  """The named axes a collective may reduce over where a value is traced
  (``shard_map``, ``pmap`` and named ``vmap`` axes; not the explicit mesh
  axes of a global view, which name no collective)."""
  env = _core.get_axis_env()
  explicit = getattr(env, "explicit_mesh_axis_names", frozenset())
  return tuple(n for n in env.axis_names() if n not in explicit)


#: The name ``jax.pmap`` gives its axis where the user names none
#: (``axis_name=None``): a name of JAX's own, which ``call_context()``
#: shows as ``None`` instead (before JAX 0.9, an object of its own class,
#: ``_TempAxisName``, one a function).
PMAP_DEFAULT_AXIS_NAME = "_internal_pmap_axis_name"
_TEMP_AXIS_NAME = getattr(_core, "_TempAxisName", None)


def is_unnamed_pmap_axis(name) -> bool:
  """Whether ``name`` is the one ``jax.pmap`` gives an axis the user did
  not name (``PMAP_DEFAULT_AXIS_NAME``, or a ``_TempAxisName``, which
  the axis environment may hand on as its text, ``<axis 0x...>``)."""
  if isinstance(name, str):
    return (name == PMAP_DEFAULT_AXIS_NAME
            or re.fullmatch(r"<axis 0x[0-9a-f]+>", name) is not None)
  return _TEMP_AXIS_NAME is not None and isinstance(name, _TEMP_AXIS_NAME)


def device_assignment(sharding) -> tuple:
  """The devices of ``sharding`` in the order of the computation's device
  assignment (what a call's ``device_index`` counts), by id where the
  sharding does not keep it."""
  devices = getattr(sharding, "_device_assignment", None)
  return tuple(devices) if devices else tuple(
      sorted(sharding.device_set, key=lambda d: d.id))


def distributed_client():
  """``(client, process_id, num_processes)`` of ``jax.distributed``, or None
  where it is not initialized; read without starting JAX's backends. The
  client's key-value store (``key_value_set_bytes``,
  ``blocking_key_value_get_bytes``, ``key_value_delete``) is the
  coordination service's, which every process of the job reaches."""
  state = _distributed.global_state
  if state.client is None:
    return None
  return state.client, state.process_id, state.num_processes
