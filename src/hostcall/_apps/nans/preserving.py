"""The equations whose outputs need no check: those that cannot make a NaN
or an infinity from finite operands (nor, where only NaNs are looked for,
a NaN from operands without one).

Where every operand of such an equation is finite, so are its outputs;
where one is not, the operand came from a checked equation that ran
before, or from an input (checked first), or from a constant: the first
value found is the same with their checks left out, and each check left
out saves a reduction over the output (most of ``find_nans``'s cost). A
constant or literal operand that already holds a NaN or an infinity (known
when traced) makes the equation checked, so that it is found where it
enters.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from hostcall import _jax_private

#: Finite operands, finite outputs: moving, selecting or comparing values,
#: and functions bounded on finite numbers. (Not ``abs`` of a complex
#: number, whose modulus may overflow: see ``_preserves``.)
_PRESERVING = frozenset({
    "reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims",
    "slice", "dynamic_slice", "dynamic_update_slice", "gather",
    "concatenate", "pad", "rev", "select_n", "copy", "copy_p", "clamp",
    "sort", "real", "imag", "conj", "complex", "neg", "sign", "floor",
    "ceil", "round", "max", "min", "reduce_max", "reduce_min", "cummax",
    "cummin", "stop_gradient", "sin", "cos", "tanh", "logistic", "erf",
    "atan", "optimization_barrier", "sharding_constraint", "device_put"})

#: Where only NaNs are looked for (``infs=False``), an infinity goes
#: unreported: these make a NaN of one.
_NAN_OF_INFINITY = frozenset({"sin", "cos"})


def _widest(dtype) -> float:
  if jnp.issubdtype(dtype, jnp.integer):
    return float(jnp.iinfo(dtype).max)
  if jnp.issubdtype(dtype, jnp.inexact):
    return float(jnp.finfo(dtype).max)
  return 1.0  # a boolean


def _preserves(eqn, invals, infs: bool) -> bool:
  name = eqn.primitive.name
  if not infs and name in _NAN_OF_INFINITY:
    return False
  if name == "abs":
    return not any(jnp.issubdtype(jnp.result_type(v), jnp.complexfloating)
                   for v in invals)
  if name == "convert_element_type":
    # A narrower float may overflow (float32 to float16, int32 to float16).
    new = eqn.params["new_dtype"]
    return (not jnp.issubdtype(new, jnp.inexact)
            or _widest(jnp.result_type(invals[0])) <= _widest(new))
  return name in _PRESERVING


def non_finite_constant(value) -> bool:
  """Whether ``value`` is known when traced (not a tracer) and holds a NaN
  or an infinity."""
  if isinstance(value, _jax_private.Tracer):
    return False
  try:
    array = np.asarray(value)
  except Exception:  # noqa: BLE001 - a value NumPy cannot hold: a key, say
    return False
  return (np.issubdtype(array.dtype, np.inexact)
          and not np.isfinite(array).all())


def needs_check(eqn, invals, infs: bool) -> bool:
  """Whether ``eqn``'s outputs (bound on ``invals``) are checked, where
  infinities are looked for (``infs``) or NaNs only."""
  return not _preserves(eqn, invals, infs) or any(
      non_finite_constant(v) for v in invals)
