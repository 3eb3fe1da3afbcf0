"""Describing what a host function returns, and checking that it did."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

_NUMBERS = (bool, int, float, complex)


def avals_from_shapes(shapes, what: str) -> tuple[Any, tuple]:
  """``(treedef, avals)`` of a pytree of shape descriptions.

  A leaf is anything with ``.shape`` and ``.dtype`` (``jax.ShapeDtypeStruct``,
  an array, a tracer) or a numeric scalar. ``None`` and ``()`` describe no
  result.
  """
  flat, tree = jax.tree_util.tree_flatten(shapes)
  avals = []
  for leaf in flat:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
      shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
    elif isinstance(leaf, _NUMBERS + (np.generic,)):
      shape, dtype = (), np.asarray(leaf).dtype
    else:
      raise ValueError(
          f"{what} should be a pytree of values with structure matching the "
          "expected result of the callback function. The values must be "
          "either numeric scalars, or must have 'shape' and 'dtype' "
          f"attributes (e.g. jax.ShapeDtypeStruct). Got {shapes!r}, whose "
          f"leaf {leaf!r} is neither.")
    avals.append(jax.core.ShapedArray(shape,
                                      jax.dtypes.canonicalize_dtype(dtype)))
  return tree, tuple(avals)


def _describe(tree, flat) -> Any:
  return jax.tree_util.tree_unflatten(tree, [
      jax.ShapeDtypeStruct(np.shape(v),
                           jax.dtypes.canonicalize_dtype(np.asarray(v).dtype))
      for v in flat])


def check_results(result, tree, avals: Sequence, who: str) -> list[np.ndarray]:
  """Flat NumPy results of ``result``, or a ``TypeError`` naming expected and
  received. Python numbers and lists are converted; 64-bit values become
  32-bit unless ``jax_enable_x64`` is on, as everywhere in JAX."""
  flat, got_tree = jax.tree_util.tree_flatten(result)
  expected = jax.tree_util.tree_unflatten(tree, list(avals))
  if not avals and not flat:
    return []  # None and () both mean "no result"
  if (got_tree != tree and tree.num_nodes == 1
      and all(isinstance(v, _NUMBERS) for v in flat)):
    # One array declared, a (nested) list of Python numbers returned.
    converted = np.asarray(result)
    if converted.dtype != object:
      flat, got_tree = [converted], tree
  if got_tree != tree:
    raise TypeError(
        f"{who} returned a result with pytree structure {got_tree}, but the "
        f"declared result shape is {tree} ({expected}). Return a value of the "
        "declared structure, or change the declared result shape.")
  out = []
  for i, (value, aval) in enumerate(zip(flat, avals)):
    array = np.asarray(value)
    array = array.astype(jax.dtypes.canonicalize_dtype(array.dtype),
                         copy=False)
    if array.shape != aval.shape or array.dtype != aval.dtype:
      raise TypeError(
          f"{who} returned {array.dtype}{list(array.shape)} for result leaf "
          f"#{i}, but the declared result shape is "
          f"{aval.dtype}{list(aval.shape)}. Expected {expected}, received "
          f"{_describe(got_tree, flat)}. Return arrays of the declared shape "
          "and dtype (e.g. `np.asarray(r, dtype)`), or change the declared "
          "result shape.")
    out.append(array)
  return out
