"""Checks of what a flavour is given, made when the program is traced.

Each names what was expected, what came, and how to fix it.
"""

from __future__ import annotations

import inspect
from typing import Callable, Sequence

import jax
import numpy as np

from hostcall import _jax_private


def check_callable(fn: Callable, what: str) -> None:
  if not callable(fn):
    raise TypeError(
        f"{what} must be callable, got {fn!r} of type {type(fn).__name__}; "
        "pass the function itself (`f`), not the result of calling it "
        "(`f(x)`).")


def _name(fn) -> str:
  name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
  module = getattr(fn, "__module__", None)
  if name and module and module not in ("builtins", "__main__"):
    return f"{module}.{name}"
  return name or repr(fn)


class CallbackArgumentsError(TypeError, jax.errors.JaxRuntimeError):
  """A callback that cannot take the arguments its call gives it, refused
  when traced. Also a ``jax.errors.JaxRuntimeError`` (a ``RuntimeError``),
  what JAX's callbacks raise for it when the computation runs, so code that
  catches JAX's error catches this one too."""

  def __init__(self, message: str):
    super().__init__(message)
    self._error_message = message  # what JaxRuntimeError's str() shows

  __str__ = TypeError.__str__


def check_arguments(fn: Callable, args: Sequence, kwargs: dict, what: str,
                    fix: str, error: type = TypeError) -> None:
  """Raises ``error`` (a ``TypeError``) when the trace already shows that
  ``fn`` cannot take the arguments its host call will give it
  (``args``/``kwargs``: placeholders of the right number and names), saying
  how to fix it."""
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return  # no signature to read (some builtins): the call will tell
  try:
    signature.bind(*args, **kwargs)
  except TypeError as exc:
    given = ", ".join([*args, *(f"{k}=..." for k in kwargs)]) or "nothing"
    raise error(
        f"{what} will call {_name(fn)}{signature} with ({given}), which it "
        f"cannot take: {exc}. {fix}") from None


_ARRAY_LIKE = (jax.Array, _jax_private.Tracer, np.ndarray, np.generic, bool,
               int, float, complex, *_jax_private.HOST_CONSTANT_TYPES)


def _holds_numbers(dtype) -> bool:
  """Whether a NumPy dtype is one JAX can hold: booleans, numbers and the
  small types of ``ml_dtypes`` (bfloat16 and the like, NumPy kind ``V``),
  not strings, bytes, objects, dates or structured records."""
  dtype = np.dtype(dtype)
  if dtype.kind in "biufc":
    return True
  return dtype.kind == "V" and dtype.fields is None and dtype.type is not np.void


def is_array_like(leaf) -> bool:
  """Whether ``leaf`` can travel to the host as an array operand."""
  if isinstance(leaf, (np.ndarray, np.generic)):
    return _holds_numbers(leaf.dtype)
  return isinstance(leaf, _ARRAY_LIKE)


def describe_leaf(leaf) -> str:
  """``leaf`` in an error: its value and type (and dtype, for arrays)."""
  text = repr(leaf)
  if len(text) > 80:
    text = text[:77] + "..."
  if isinstance(leaf, (np.ndarray, np.generic)):
    return (f"{text}, a NumPy {type(leaf).__name__} of dtype {leaf.dtype} "
            "(not numbers)" if not _holds_numbers(leaf.dtype) else
            f"{text} of dtype {leaf.dtype}")
  return f"{text} of type {type(leaf).__name__}"


def check_operands(flat, what: str) -> None:
  """Raises a ``TypeError`` naming the first leaf that is not array-like."""
  for leaf in flat:
    if not is_array_like(leaf):
      raise TypeError(
          f"{what}: every leaf of the arguments sent to the host must be a "
          f"JAX array, a NumPy array of numbers or booleans, or a Python "
          f"number; got {describe_leaf(leaf)}. Pass other Python objects "
          "(strings too) to the host function through a closure or "
          "functools.partial instead.")
