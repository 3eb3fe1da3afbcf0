"""Derivatives of host calls that ``vmap`` has already batched.

A batched ``hostcall_p`` equation keeps its batch levels in ``transforms``
(``("batch", batch_dims, axis_size)``, innermost first) because the host
function itself sees one element at a time. A target's derivative rules
(``target.jvp``, ``target.transpose``) are written for one element; here they
are lifted over the batch levels with ``jax.vmap``, innermost level innermost,
so that ``jvp`` of ``vmap`` and ``grad`` of ``vmap`` are right.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from hostcall import _jax_private
from hostcall._core.tangents import instantiate, zeros


def lifted_jvp(jvp: Callable, levels: Sequence, primals: list,
               tangents: list) -> list:
  """``jvp(primals, tangents)`` for one element, applied to the batch.

  Symbolic zero tangents stay symbolic for ``jvp``, which may rely on them
  (a rule linear in some operands); results come back batched at axis 0.
  """
  moving = [i for i, t in enumerate(tangents) if type(t) is not _jax_private.Zero]

  def one(prims, moving_tangents):
    tans = [_jax_private.Zero(jax.typeof(p).to_tangent_aval()) for p in prims]
    for i, t in zip(moving, moving_tangents):
      tans[i] = t
    return [instantiate(t) for t in jvp(list(prims), tans)]

  fn = one
  for dims, size in levels:
    fn = jax.vmap(fn, in_axes=(list(dims), [dims[i] for i in moving]),
                  out_axes=0, axis_size=size)
  return fn(list(primals), [tangents[i] for i in moving])


def _unbatched_shape(shape, dims_per_level, i) -> tuple:
  shape = list(shape)
  for dims, _ in reversed(dims_per_level):  # outermost axis first
    if dims[i] is not None:
      del shape[dims[i]]
  return tuple(shape)


def lifted_transpose(transpose: Callable, levels: Sequence, cts: list,
                     args: Sequence) -> list:
  """``transpose(cts, args)`` for one element, applied to the batch.

  Known operands (residuals) are batched as ``levels`` say; cotangents of the
  results are batched at axis 0; cotangents of the linear operands are
  returned batched where the operands were (summed where they were not).
  """
  linear = [i for i, a in enumerate(args) if _jax_private.is_undefined_primal(a)]
  known = [i for i in range(len(args)) if i not in linear]
  avals = {i: _jax_private.ShapedArray(_unbatched_shape(args[i].aval.shape,
                                                    levels, i),
                                   args[i].aval.dtype) for i in linear}

  def one(known_values, cts_):
    full = list(args)
    for i, v in zip(known, known_values):
      full[i] = v
    for i in linear:
      full[i] = _jax_private.UndefinedPrimal(avals[i])
    out = transpose(list(cts_), full)
    return [instantiate(out[i]) if out[i] is not None else zeros(avals[i])
            for i in linear]

  fn = one
  for dims, size in levels:
    fn = _one_level(fn, dims, size, known, linear)
  results = fn([args[i] for i in known], [instantiate(c) for c in cts])
  out = [None] * len(args)
  for i, r in zip(linear, results):
    out[i] = r
  return out


def _one_level(fn, dims, size, known, linear):
  def level(known_values, cts_):
    outs = jax.vmap(fn, in_axes=([dims[i] for i in known], 0), out_axes=0,
                    axis_size=size)(known_values, cts_)
    return [o.sum(0) if dims[i] is None else jnp.moveaxis(o, 0, dims[i])
            for o, i in zip(outs, linear)]
  return level
