"""The device side of a steered loop: the stop check, a primitive of its
own (``control_check_p``) with its rules, answered by the stop check's
native library (``hostcall_control_check``,
``stop_states_library.py``) or, where
``emission`` routes it to Python, by ``controls.poll``: both read the same
``StopStates`` (``states.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from hostcall import _jax_private
from hostcall._apps.control.host import controls
from hostcall._apps.loops.waiting_operand import waiting_operand
from hostcall._runtime import emission


control_check_p = jex_core.Primitive("hostcall_control_check")

_INT = np.int32


def check(handle, index, after=None) -> jax.Array:
  """The stop check of a steered loop: 0 to go on, else the reason to stop.

  Arguments:
    handle: the invocation's handle (what the loop's open returned).
    index: how many checks this invocation has made before, plus one.
    after: the chunk's results: the check waits for them (else XLA may ask
      at the chunk's start, when the host has yet to see the last chunk).
  """
  # An operand, not an ordering hint: XLA schedules a side-effecting call
  # as early as its operands allow.
  reason = control_check_p.bind(jnp.asarray(handle, _INT).reshape(()),
                                jnp.asarray(index, _INT).reshape(()),
                                waiting_operand(after))
  names = _jax_private.collective_axis_names()
  if names and jax.process_count() > 1:
    # Inside shard_map or pmap each device asks its own process's host;
    # the devices of one process agree already (hostcall_control.cc),
    # those of other processes (another host's clock, Ctrl-C, predicate,
    # a contained failure) through this reduction, so that no device
    # leaves a loop whose collectives its peers still run. In one process
    # no collective is added: a device that fails outside hostcall's host
    # functions (an XLA error, JAX's own callbacks) never leaves its peers
    # waiting in one.
    reason = jax.lax.pmax(reason, names)
  return reason


control_finish_p = jex_core.Primitive("hostcall_control_finish")


def finish_here(handle, reason) -> jax.Array:
  """``hostcall.jit``'s end of a steered loop on its one device, made by
  the device itself where the stop states' FFI handler serves it: the loop
  takes no more Ctrl-C, and the answer (int32) is not 0 where the host's
  ``finish`` must still run (to raise a failure its group contained, or
  where this cannot tell). Bound only while ``hostcall.jit`` compiles."""
  return control_finish_p.bind(jnp.asarray(handle, _INT).reshape(()),
                               jnp.asarray(reason, _INT).reshape(()))


def _finish_lowering(ctx, handle, reason):
  if emission.route(ctx, "check", controls.native) == "ffi":
    return jax.ffi.build_ffi_lowering_function(
        "hostcall_control_finish", has_side_effect=True)(
            ctx, handle, reason).results
  # (No handler: the host's finish always runs, as it does under jax.jit.)
  return [_jax_private.ir_constant(np.int32(1))]


def _abstract_eval(handle, index, after):
  del handle, index, after
  return _jax_private.ShapedArray((), _INT)


def _batching_rule(args, dims):
  # Every lane of a loop stops together: one check for the batch (the
  # handle is the same in every lane; the latest lane's index counts; the
  # check waits for every lane's results).
  handle, index, after = [a if d is None else jnp.moveaxis(a, d, 0).reshape(-1)
                          for a, d in zip(args, dims)]
  # (A vmap of no lane never runs the check: any handle and index do.)
  handle = (handle if jnp.ndim(handle) == 0
            else handle[0] if handle.size else jnp.int32(-1))
  index = index if jnp.ndim(index) == 0 else jnp.max(index, initial=0)
  after = after if after.size <= 1 else jnp.sum(after, keepdims=True)
  return control_check_p.bind(handle, index, after.reshape(-1)[:1]), None


def _jvp_rule(primals, tangents):
  del tangents
  out = control_check_p.bind(*primals)
  return out, _jax_private.Zero(jax.typeof(out).to_tangent_aval())


def _remat_rule(saveable, unks_in, inst_in, eqn):
  # Asked once: recomputing the check where the backward pass
  # rematerialises would get another answer.
  del saveable, inst_in
  if any(unks_in):
    return None, eqn, [True], [True], []
  return eqn, None, [False], [False], []


def _lowering(ctx, handle, index, after):
  axis_context = ctx.module_context.axis_context
  global_view = emission.global_view(axis_context)
  if emission.route(ctx, "check", controls.native) == "ffi":
    return jax.ffi.build_ffi_lowering_function(
        "hostcall_control_check", has_side_effect=True)(
            ctx, handle, index, after).results

  def poll(h, i, after):
    del after
    return (np.asarray(controls.poll(int(h), int(i)), _INT),)

  # Under a global view of several devices one device asks, and every
  # device reads its answer (as hostcall's calls with results do).
  chosen = None
  if global_view:
    chosen = jax.sharding.SingleDeviceSharding(
        axis_context.device_assignment[0])
  results, _, _ = _jax_private.emit_python_callback(
      ctx, poll, None, [handle, index, after], list(ctx.avals_in),
      list(ctx.avals_out), has_side_effect=True, returns_token=False,
      sharding=_jax_private.callback_op_sharding(axis_context, chosen,
                                                 list(ctx.avals_out)))
  if chosen is not None:
    results = [_jax_private.replicated(ctx, r, a)
               for r, a in zip(results, ctx.avals_out)]
  return results


control_finish_p.def_abstract_eval(
    lambda handle, reason: _jax_private.ShapedArray((), _INT))
_jax_private.register_lowering(control_finish_p, _finish_lowering)

control_check_p.def_abstract_eval(_abstract_eval)
control_check_p.def_impl(lambda handle, index, after: jax.jit(
    control_check_p.bind)(handle, index, after))
_jax_private.primitive_batchers[control_check_p] = _batching_rule
_jax_private.primitive_jvps[control_check_p] = _jvp_rule
_jax_private.partial_eval_jaxpr_custom_rules[control_check_p] = _remat_rule
_jax_private.register_lowering(control_check_p, _lowering)
