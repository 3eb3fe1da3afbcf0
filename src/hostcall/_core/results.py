"""Describing what a host function returns, and checking that it did."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

from hostcall import _jax_private

_NUMBERS = (bool, int, float, complex)


class ResultError(TypeError, jax.errors.JaxRuntimeError):
  """A host function returned something other than its declared result.

  Both a ``TypeError`` (what hostcall raised before) and a
  ``jax.errors.JaxRuntimeError`` (a ``RuntimeError``: what JAX's callbacks
  raise for the same mistake), so that code catching JAX's error catches
  it too where hostcall raises it itself (under ``jax.disable_jit()``).
  """

  def __init__(self, message: str):
    super().__init__(message)
    self._error_message = message  # what JaxRuntimeError's str() shows

  __str__ = TypeError.__str__


def _is_x64_only(dtype) -> bool:
  return jax.dtypes.canonicalize_dtype(dtype) != dtype


def avals_from_shapes(shapes, what: str, *, legacy: bool = False
                      ) -> tuple[Any, tuple]:
  """``(treedef, avals)`` of a pytree of shape descriptions.

  A leaf is anything with ``.shape`` and ``.dtype`` (``jax.ShapeDtypeStruct``,
  an array, a tracer). ``None`` and ``()`` describe no result. As in JAX, a
  64-bit dtype is refused while ``jax_enable_x64`` is off.

  ``legacy``: the removed ``host_callback.call``'s rules instead: numeric
  scalars describe scalars of their type, and 64-bit types are silently
  narrowed.
  """
  flat, tree = jax.tree_util.tree_flatten(shapes)
  avals = []
  for leaf in flat:
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
      shape, dtype = tuple(leaf.shape), np.dtype(leaf.dtype)
    elif legacy and isinstance(leaf, _NUMBERS + (np.generic,)):
      shape, dtype = (), np.asarray(leaf).dtype
    else:
      hint = ""
      if all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        hint = (f" Numbers are not shapes: for an array of shape "
                f"{tuple(flat)} write jax.ShapeDtypeStruct({tuple(flat)}, "
                "dtype).")
      must = ("must be either numeric scalars, or must have 'shape' and "
              "'dtype' attributes" if legacy else "must have 'shape' and "
              "'dtype' attributes (e.g. jax.ShapeDtypeStruct, or an array "
              "like the result)")
      raise ValueError(
          f"{what} should be a pytree of values with structure matching the "
          f"expected result of the callback function. The values {must}. Got "
          f"{shapes!r}, whose leaf {leaf!r} of type {type(leaf).__name__} is "
          f"not one.{hint}")
    if _is_x64_only(dtype):
      if not legacy:
        raise ValueError(
            f"{what} cannot specify 64-bit types when `jax_enable_x64` is "
            f"disabled (got {dtype} in {shapes!r}). Declare "
            f"{jax.dtypes.canonicalize_dtype(dtype)}, or enable 64-bit types "
            "with jax.config.update('jax_enable_x64', True).")
      dtype = jax.dtypes.canonicalize_dtype(dtype)
    avals.append(_jax_private.ShapedArray(shape, dtype))
  return tree, tuple(avals)


class _Spec:
  """Shows a leaf as ``float32[3]``, the way JAX prints avals."""

  def __init__(self, shape, dtype):
    self.text = f"{np.dtype(dtype).name}[{','.join(map(str, shape))}]"

  def __repr__(self):
    return self.text


def _describe(value) -> str:
  leaves = jax.tree_util.tree_leaves(value)
  if len(leaves) > 8:
    return f"{len(leaves)} values in {jax.tree_util.tree_structure(value)}"
  return repr(jax.tree_util.tree_map(
      lambda v: _Spec(np.shape(v), np.result_type(v)) if _has_dtype(v) else v,
      value))


def _has_dtype(v) -> bool:
  try:
    np.result_type(v)
    return True
  except Exception:  # noqa: BLE001 - anything without a dtype
    return False


def _is_number_tree(value) -> bool:
  """A Python number, or a (nested) list/tuple of them."""
  if isinstance(value, _NUMBERS):
    return True
  return (isinstance(value, (list, tuple)) and bool(value)
          and all(_is_number_tree(v) for v in value))


class _Checker:
  """Checks one host function's result against its declaration."""

  def __init__(self, result, tree, avals: Sequence, who: str, legacy: bool):
    self.result, self.tree, self.avals = result, tree, tuple(avals)
    self.who, self.legacy = who, legacy
    self.expected = jax.tree_util.tree_unflatten(
        tree, [_Spec(a.shape, a.dtype) for a in avals])

  def fail(self, message: str, fix: str):
    if self.legacy:  # the removed module's words
      raise ResultError(
          f"Callback func {self.who} should have returned a result with "
          f"abstract values {self.expected!r} but returned "
          f"{_describe(self.result)}. ({message}.) {fix}")
    raise ResultError(f"{self.who} returned a wrong result. {message}. {fix}")

  def fail_count(self, expected: int, actual: int, fix: str):
    """The number of leaves differs: both structures shown, which say more
    than the counts (and name no shape twice)."""
    if self.legacy:
      self.fail(f"Mismatched number of outputs from callback. Expected: "
                f"{expected}, Actual: {actual}", fix)
    raise ResultError(
        f"{self.who} returned {_describe(self.result)}, but the declared "
        f"result is {self.expected!r}. Mismatched number of outputs from "
        f"callback. Expected: {expected}, Actual: {actual}. {fix}")

  def leaves(self) -> list:
    result, avals = self.result, self.avals
    if self.legacy:
      got_tree = jax.tree_util.tree_structure(result)
      if got_tree != self.tree and not (
          len(avals) == 1 and _is_number_tree(result)):
        raise ResultError(
            f"Callback func {self.who} should have returned a result with "
            f"pytree {self.tree} but returned {got_tree}. Return a value of "
            "the declared structure, or change result_shape.")
    flat = jax.tree_util.tree_leaves(result)
    if len(flat) == len(avals):
      return flat
    if len(avals) == 1 and _is_number_tree(result):
      return [result]  # hostcall converts a nested list of numbers
    self.fail_count(
        len(avals), len(flat),
        "Return one array per declared leaf (in any container), or change "
        "the declared result.")

  def array(self, i: int, value, aval) -> np.ndarray:
    if _is_number_tree(value):
      return self._from_numbers(i, value, aval)
    try:
      array = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - ragged lists and the like
      self.fail(f"Result #{i} is not an array ({type(exc).__name__}: {exc})",
                f"Return arrays of shape {aval.shape} and dtype {aval.dtype}.")
    if not array.dtype.isnative:
      array = array.astype(array.dtype.newbyteorder("="))
    if array.dtype != object:
      array = array.astype(jax.dtypes.canonicalize_dtype(array.dtype),
                           copy=False)
    if array.shape != aval.shape:
      self.fail(f"Incorrect output shape for return value #{i}: Expected: "
                f"{aval.shape}, Actual: {array.shape}",
                "Return arrays of the declared shape, or change the declared "
                "result.")
    if array.dtype != aval.dtype:
      self.fail(f"Incorrect output dtype for return value #{i}: Expected: "
                f"{aval.dtype}, Actual: {array.dtype}",
                f"Return arrays of the declared dtype (e.g. "
                f"`np.asarray(r, np.{aval.dtype})`), or change the declared "
                "result.")
    return array

  def _from_numbers(self, i: int, value, aval) -> np.ndarray:
    """Python numbers (or nested lists of them), converted to the declared
    dtype where no value changes kind or is cut off."""
    try:
      array = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - ragged nested lists
      self.fail(f"Result #{i} is a ragged list ({type(exc).__name__}: {exc})",
                f"Return a rectangular list or an array of shape "
                f"{aval.shape}.")
    if array.dtype == object:
      self.fail(f"Result #{i} is a ragged or mixed list",
                f"Return a rectangular list or an array of shape "
                f"{aval.shape}.")
    if array.shape != aval.shape:
      self.fail(f"Incorrect output shape for return value #{i}: Expected: "
                f"{aval.shape}, Actual: {array.shape}",
                "Return values of the declared shape, or change the declared "
                "result.")
    target = np.dtype(aval.dtype)
    if not np.can_cast(array.dtype, target, "same_kind") and not (
        array.dtype == np.bool_):
      self.fail(f"Incorrect output dtype for return value #{i}: Expected: "
                f"{target}, Actual: {array.dtype}",
                f"Converting {array.dtype} numbers to {target} would change "
                f"their value; return `np.asarray(r, np.{target})` if that is "
                "what you want.")
    with np.errstate(all="ignore"):
      converted = array.astype(target)
    if (np.issubdtype(target, np.integer) and
        not np.array_equal(converted.astype(array.dtype), array)):
      self.fail(f"Result #{i} does not fit in {target}",
                "Return values in the declared dtype's range, or declare a "
                "wider dtype.")
    return converted


def check_results(result, tree, avals: Sequence, who: str, *,
                  legacy: bool = False) -> list[np.ndarray]:
  """Flat NumPy results of ``result``, or a ``ResultError`` naming expected
  and received.

  As in JAX, results are matched to the declaration leaf by leaf (any
  container holding the right number of arrays will do), and 64-bit values
  become 32-bit unless ``jax_enable_x64`` is on. hostcall also converts
  Python numbers and (nested) lists of them to the declared dtype when no
  value changes (an int for a float result, not a float for an int one).
  ``legacy``: the removed ``host_callback.call``'s stricter rule, the same
  pytree structure as declared.
  """
  if not avals:
    if jax.tree_util.tree_leaves(result):
      checker = _Checker(result, tree, avals, who, legacy)
      checker.fail_count(
          0, len(jax.tree_util.tree_leaves(result)),
          "Return None, or declare the result's shape and dtype.")
    return []
  checker = _Checker(result, tree, avals, who, legacy)
  return [checker.array(i, value, aval) for i, (value, aval)
          in enumerate(zip(checker.leaves(), avals))]
