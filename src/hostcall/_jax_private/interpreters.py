"""JAX's interpreter APIs a primitive needs (``jax.interpreters``,
``jax.core``): rule registries, symbolic zeros, abstract values, and the
MLIR callback helpers, the same on every supported release."""

from __future__ import annotations

import inspect

import jax
import numpy as np
from jax import core as _public_core
from jax.extend import core as _jex_core
from jax._src import core as _core
from jax._src import effects as _effects
from jax._src import literals as _literals
from jax._src import named_sharding as _named_sharding
from jax._src import sharding_impls as _sharding_impls
from jax._src.interpreters import mlir as _private_mlir
from jax.interpreters import ad as _ad
from jax.interpreters import batching as _public_batching
from jax.interpreters import mlir as _mlir
from jax.interpreters import partial_eval as _public_pe


#: Abstract values: the shape and dtype of an array; a tracer's class.
ShapedArray = _public_core.ShapedArray
Tracer = _public_core.Tracer

#: Automatic differentiation: a symbolic zero tangent, the marker of an
#: operand being transposed, and the rule registries.
Zero = _ad.Zero
UndefinedPrimal = _ad.UndefinedPrimal
is_undefined_primal = _ad.is_undefined_primal
primitive_jvps = _ad.primitive_jvps
primitive_transposes = _ad.primitive_transposes

#: ``vmap``: the rule registries (``fancy`` rules receive the axis data).
primitive_batchers = _public_batching.primitive_batchers
fancy_primitive_batchers = _public_batching.fancy_primitive_batchers

#: ``jax.checkpoint``: how a primitive is split between saved and
#: rematerialised computation.
partial_eval_jaxpr_custom_rules = _public_pe.partial_eval_jaxpr_custom_rules

#: MLIR lowering: the rule registry, effect tokens, constants
#: (``emit_python_callback`` and ``aval_to_ir_types``: below, with what
#: older releases need).
register_lowering = _mlir.register_lowering
TokenSet = _mlir.TokenSet
ir_constant = _mlir.ir_constant

#: The base class of effects, and the current trace: public in
#: ``jax.extend.core`` from JAX 0.10, the same objects in ``jax._src`` before.
Effect = getattr(_jex_core, "Effect", None) or _effects.Effect
take_current_trace = (getattr(_jex_core, "take_current_trace", None)
                      or _core.take_current_trace)

# Before JAX 0.10, ``aval_to_ir_types(aval)``, without the module context.
_AVAL_TO_IR_TYPES_TAKES_CONTEXT = len(
    inspect.signature(_mlir.aval_to_ir_types).parameters) == 2


def aval_to_ir_types(module_context, aval):
  """The IR types of ``aval`` (``mlir.aval_to_ir_types``), on every JAX."""
  if _AVAL_TO_IR_TYPES_TAKES_CONTEXT:
    return _mlir.aval_to_ir_types(module_context, aval)
  return _mlir.aval_to_ir_types(aval)


#: Host constants JAX may hand a primitive that are not ``np.ndarray``:
#: JAX 0.8-0.9's ``TypedNdArray`` wraps one (from 0.10 it subclasses it).
_TYPED = getattr(_literals, "TypedNdArray", None)
HOST_CONSTANT_TYPES: tuple[type, ...] = (
    (_TYPED,) if _TYPED is not None and not issubclass(_TYPED, np.ndarray)
    else ())

# Before JAX 0.8.2, no ``returns_token``: a token is returned exactly when
# one is passed, which is what hostcall always asks for.
_EMIT_TAKES_RETURNS_TOKEN = "returns_token" in inspect.signature(
    _mlir.emit_python_callback).parameters

# Before JAX 0.10, the token of an ordered callback with results is
# annotated as replicated, which XLA refuses on several devices ("side-effect
# HLO cannot have a replicated sharding"); 0.10 puts it on the callback's
# device, as hostcall then does.
_TOKEN_SHARDING_IS_REPLICATED = jax.__version_info__ < (0, 10)

# Before JAX 0.10, sub-byte arrays crossing a Python callback are garbled
# when their size is not a multiple of the packing (JAX's own callbacks
# too): hostcall widens them around the callback there.
_WIDER = ({"int2": np.int8, "int4": np.int8, "uint2": np.uint8,
           "uint4": np.uint8, "float4_e2m1fn": np.float32}
          if jax.__version_info__ < (0, 10) else {})


def _widened(aval):
  wider = _WIDER.get(getattr(aval.dtype, "name", None))
  return aval if wider is None else aval.update(dtype=np.dtype(wider))


def emit_python_callback(ctx, callback, token, operands, operand_avals,
                         result_avals, *, returns_token: bool = True,
                         sharding=None, **kwargs):
  """JAX's runtime Python callback (``mlir.emit_python_callback``): returns
  ``(results, token, keep_alive)``, the same on every supported JAX."""
  wide_in = [_widened(a) for a in operand_avals]
  wide_out = [_widened(a) for a in result_avals]
  if wide_in != list(operand_avals) or wide_out != list(result_avals):
    return _emit_widened(ctx, callback, token, operands, operand_avals,
                         result_avals, wide_in, wide_out,
                         returns_token=returns_token, sharding=sharding,
                         **kwargs)
  if _EMIT_TAKES_RETURNS_TOKEN:
    kwargs["returns_token"] = returns_token
  results, token_out, keep = _mlir.emit_python_callback(
      ctx, callback, token, operands, operand_avals, result_avals,
      sharding=sharding, **kwargs)
  if (_TOKEN_SHARDING_IS_REPLICATED and token_out is not None and result_avals
      and isinstance(sharding, _sharding_impls.SdyArrayList)):
    device = _named_sharding.SdyArray(
        mesh_shape=(), dim_shardings=[],
        logical_device_ids=sharding.shardings[0].logical_device_ids)
    _private_mlir.set_sharding(token_out.owner, _sharding_impls.SdyArrayList(
        [device, *sharding.shardings]))
  return results, token_out, keep


def _emit_widened(ctx, callback, token, operands, operand_avals,
                  result_avals, wide_in, wide_out, **kwargs):
  """The callback on widened sub-byte operands and results (JAX < 0.10)."""
  narrow_in = [a.dtype for a in operand_avals]
  narrow_out = list(result_avals)

  def widened_callback(*flat):
    outs = callback(*[np.asarray(x).astype(d, copy=False)
                      for x, d in zip(flat, narrow_in)])
    return tuple(np.asarray(o).astype(w.dtype) if w is not n else o
                 for o, w, n in zip(outs, wide_out, narrow_out))

  operands = [x if w is a else _private_mlir.convert_hlo(ctx, x, a, w)
              for x, a, w in zip(operands, operand_avals, wide_in)]
  ctx = ctx.replace(avals_in=wide_in, avals_out=wide_out)
  results, token_out, keep = emit_python_callback(
      ctx, widened_callback, token, operands, wide_in, wide_out, **kwargs)
  results = [r if w is n else _private_mlir.convert_hlo(ctx, r, w, n)
             for r, w, n in zip(results, wide_out, narrow_out)]
  return results, token_out, keep
