"""Tangents of host calls: which values have them, and symbolic zeros made
concrete (for the core's derivative rules and ``_derivatives``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hostcall import _jax_private


def is_inexact(dtype) -> bool:
  """Whether values of ``dtype`` have tangents (floating or complex)."""
  return jnp.issubdtype(dtype, jnp.inexact)


def zeros(aval):
  """Zeros of ``aval``'s shape and dtype (float0 stays float0)."""
  if aval.dtype == jax.dtypes.float0:
    return np.zeros(aval.shape, jax.dtypes.float0)
  return jnp.zeros(aval.shape, aval.dtype)


def instantiate(t, aval=None):
  """``t``, or concrete zeros where it is a symbolic zero (of ``aval``, or
  of its own abstract value)."""
  if type(t) is _jax_private.Zero:
    return zeros(t.aval if aval is None else aval)
  return t
