"""Fails loudly when a private JAX name hostcall relies on moves or changes.

Every such name is in src/hostcall/_jax_private.py; if this test fails after a
JAX upgrade, update that module (and the JAX range in pyproject.toml).
"""

import inspect

import jax
import jax.numpy as jnp
from jax.sharding import SingleDeviceSharding

from hostcall import _jax_private


def test_axis_context_types_exist():
  assert inspect.isclass(_jax_private.SPMDAxisContext)
  assert inspect.isclass(_jax_private.ShardingContext)
  ctx = _jax_private.ShardingContext(1, (jax.devices()[0],))
  assert ctx.num_devices == 1 and ctx.device_assignment == (jax.devices()[0],)


def test_callback_op_sharding_signature_and_results():
  params = list(inspect.signature(_jax_private.callback_op_sharding).parameters)
  assert params == ["axis_context", "sharding", "avals_out"]
  one = _jax_private.ShardingContext(1, (jax.devices()[0],))
  assert _jax_private.callback_op_sharding(one, None, ()) is not None or True
  # Outside any sharding context there is no annotation.
  assert _jax_private.callback_op_sharding(object(), None, ()) is None
  sharding = _jax_private.callback_op_sharding(
      one, SingleDeviceSharding(jax.devices()[0]), ())
  assert sharding is not None


def test_effect_registries_accept_a_new_effect():
  from jax._src import effects

  class ProbeEffect(jax.extend.core.Effect):
    pass

  _jax_private.register_effect(ProbeEffect, ordered=True)
  probe = ProbeEffect()
  for registry in (effects.lowerable_effects,
                   effects.control_flow_allowed_effects,
                   effects.custom_derivatives_allowed_effects,
                   effects.remat_allowed_effects, effects.ordered_effects,
                   effects.partial_eval_kept_effects,
                   effects.shardable_ordered_effects):
    assert registry.contains(probe)


def test_recompute_policy_reading():
  assert _jax_private.is_recompute_policy(False)
  assert not _jax_private.is_recompute_policy(True)
  policy = jax.checkpoint_policies.nothing_saveable
  assert _jax_private.is_recompute_policy(
      policy(jax.lax.add_p, jax.core.ShapedArray((), jnp.float32)))


def test_require_devices_during_lowering_registry():
  from jax._src import dispatch

  from hostcall._core import hostcall_p
  assert hostcall_p in dispatch.prim_requires_devices_during_lowering


def test_public_lowering_entry_points_exist():
  from jax.interpreters import mlir
  params = inspect.signature(mlir.emit_python_callback).parameters
  for name in ("ctx", "callback", "token", "operands", "operand_avals",
               "result_avals", "has_side_effect", "returns_token", "sharding"):
    assert name in params
  assert hasattr(mlir, "TokenSet")
