"""Staging a modern callback: validate, build the target, bind, differentiate."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from hostcall import _jax_private
from hostcall._core import bind
from hostcall._derivatives import linear
from hostcall._derivatives.rules import HostFunction
from hostcall._core import results
from hostcall._flavours._target import VMAP_METHODS, CallbackTarget
from hostcall._core.checks import (CallbackArgumentsError, check_arguments,
                                   check_callable, check_operands)

def check_vmap_method(vmap_method) -> None:
  allowed = [*VMAP_METHODS, None]
  if vmap_method not in allowed:
    raise ValueError(
        f"vmap_method must be one of {allowed}, but got: {vmap_method!r}.")


def _check_callback_arguments(flavour, callback, result_shape_dtypes, args,
                              kwargs) -> None:
  """Refuses, when traced, a callback that cannot take its arguments."""
  names = [f"arg{i}" for i in range(len(args))]
  fix = (f"hostcall.{flavour} calls callback(*args, **kwargs) with the "
         "arguments given after result_shape_dtypes.")
  if not args and hasattr(result_shape_dtypes, "shape") and (
      not isinstance(result_shape_dtypes, jax.ShapeDtypeStruct)):
    fix += (" Did you forget result_shape_dtypes? "
            f"hostcall.{flavour}(callback, result_shape_dtypes, *args), e.g. "
            f"hostcall.{flavour}(np.sin, jax.ShapeDtypeStruct(x.shape, "
            "x.dtype), x).")
  fn = callback.fn if isinstance(callback, HostFunction) else (
      callback)
  # JAX fails the computation with a JaxRuntimeError when it runs; the
  # early error is also one, so that what catches JAX's catches it.
  check_arguments(fn, names, dict.fromkeys(kwargs, None),
                  f"hostcall.{flavour}", fix, error=CallbackArgumentsError)
  if isinstance(callback, HostFunction):
    for rule, second in ((callback.jvp, "tangents"), (callback.vjp,
                                                      "cotangent")):
      if rule is not None:
        check_arguments(rule, ["primals", second],
                        dict.fromkeys(kwargs, None),
                        f"a derivative rule of hostcall.{flavour}",
                        f"A rule is called as rule(primals, {second}, "
                        "**kwargs) with the callback's keyword arguments.")


def with_rules(callback, jvp, vjp, finite_differences):
  """``callback`` as a ``HostFunction`` if derivative options were given."""
  if jvp is None and vjp is None and not finite_differences:
    return callback
  if isinstance(callback, HostFunction):
    raise TypeError("pass derivative rules either on the HostFunction or as "
                    "jvp=/vjp=/finite_differences=, not both.")
  return HostFunction(callback, jvp=jvp, vjp=vjp,
                                  finite_differences=finite_differences)


def stage(flavour: str, callback: Callable, result_shape_dtypes, args: tuple,
          kwargs: dict, *, ordering: str, sharding=None, partitioned=False,
          vmap_method: str | None,
          vmap_error: Callable[[], Exception] | None = None,
          jvp_error: Callable[[], Exception] | None = None) -> Any:
  """Stages ``callback(*args, **kwargs)`` on the host; returns its result.

  ``jvp_error`` builds the exception raised when a non-zero tangent reaches
  a call without rules (``None``: its results are constants).
  """
  check_callable(callback, f"{flavour}'s callback")
  _check_callback_arguments(flavour, callback, result_shape_dtypes, args,
                            kwargs)
  flat, in_tree = jax.tree_util.tree_flatten((args, kwargs))
  check_operands(flat, flavour)
  out_tree, out_avals = results.avals_from_shapes(result_shape_dtypes,
                                                  "result_shape_dtypes")
  derivs = None
  if isinstance(callback, HostFunction) and out_avals:
    in_avals = [_jax_private.ShapedArray(np.shape(x), jnp.result_type(x))
                for x in flat]
    derivs = linear.Derivatives(callback, in_tree, tuple(in_avals),
                                out_tree, tuple(out_avals))
  host_target = CallbackTarget(
      flavour=flavour, callback=callback, in_tree=in_tree,
      result_tree=out_tree, result_avals=tuple(out_avals), method=vmap_method,
      vmap_error=vmap_error, jvp_error=jvp_error, derivatives=derivs)
  if partitioned and out_avals:
    raise ValueError(
        f"{flavour}: partitioned=True calls the host once per shard and "
        "cannot return results (JAX: Partitioned callback not supported with "
        "return values). Declare no result, or drop partitioned=True.")
  outs = bind(flat, target=host_target, kind="call", result_avals=out_avals,
              ordering=ordering, sharding=sharding, partitioned=partitioned)
  return jax.tree_util.tree_unflatten(out_tree, outs)
