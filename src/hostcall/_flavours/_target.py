"""The host side of a modern callback: unbatching, calling, checking."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from hostcall._core import host, results
from hostcall._core.primitive import VECTORISED
from hostcall._core.host import hash_key

VMAP_METHODS = ("sequential", "sequential_unrolled", *VECTORISED)


def call_per_element(call: Callable[[list], list], flat_args: list,
                     levels: Sequence, n_results: int) -> list:
  """Calls ``call`` once per batch element, in index order, and stacks.

  ``levels`` are ``(batch_dims, axis_size)`` of the vmaps, innermost first;
  the outermost is peeled first, since inner levels' ``batch_dims`` refer to
  arrays without its axis.
  """
  if not levels:
    return list(call(flat_args))
  *inner, (dims, size) = levels
  per_element = []
  for i in range(size):
    sliced = [a if d is None else np.take(a, i, axis=d)
              for a, d in zip(flat_args, dims)]
    per_element.append(call_per_element(call, sliced, inner, n_results))
  if not n_results:
    return []
  return [np.stack(column) for column in zip(*per_element)]


@dataclasses.dataclass(frozen=True)
class CallbackSpec:
  """What a modern callback call site is, as its target carries it."""

  flavour: str                 # "pure_callback", "io_callback", ...
  callback: Callable
  in_tree: Any                 # pytree of (args, kwargs)
  result_tree: Any
  result_avals: tuple
  vmap_method: str | None      # None: vmap refused with vmap_error
  vmap_error: Callable[[], Exception] | None = None
  jvp_error: Callable[[], Exception] | None = None  # None: zero tangents
  derivatives: Any = None      # a _linear.Derivatives, when rules were given


class CallbackTarget(host.HostTarget):
  """Calls ``callback(*args, **kwargs)`` with NumPy arrays on the host."""

  returns_results = True

  def __init__(self, spec: CallbackSpec):
    super().__init__((spec.flavour, hash_key(spec.callback), spec.in_tree,
                      spec.result_tree, spec.result_avals, spec.vmap_method,
                      spec.jvp_error is None))
    self.spec = spec
    if spec.flavour in ("debug_callback", "debug_print"):
      self.remat = "debug"
      self.inline_outside_jit = True

  @property
  def name(self) -> str:
    return getattr(self.spec.callback, "__name__", repr(self.spec.callback))

  def __repr__(self):
    return f"{self.spec.flavour}({self.name!r})"

  @property
  def label(self) -> str:
    return f"hostcall.{self.spec.flavour}"

  @property
  def jax_name(self) -> str:
    return {"debug_callback": "jax.debug.callback",
            "debug_print": "jax.debug.callback"}.get(
                self.spec.flavour, f"jax.{self.spec.flavour}")

  def vmap_method(self) -> str:
    if self.spec.vmap_method is None:
      raise self.spec.vmap_error()
    return self.spec.vmap_method

  def has_derivatives(self) -> bool:
    return self.spec.derivatives is not None

  def jvp(self, primals, tangents):
    if self.spec.derivatives is None:
      return None
    return self.spec.derivatives.jvp(primals, tangents)

  def transpose(self, cts, args):
    del cts
    if self.spec.flavour == "io_callback":
      raise ValueError("IO callbacks do not support transpose.")
    if self.spec.flavour == "pure_callback":
      raise ValueError(
          "Pure callbacks do not support transpose. Please use "
          "`jax.custom_vjp` to use callbacks while taking gradients. "
          "hostcall: or pass vjp= (a host derivative rule) to "
          "hostcall.pure_callback.")
    # A debug callback of a linear value contributes no cotangent, and JAX
    # does not call it in the transposed program either.
    return [None] * len(args)

  def check_differentiable(self) -> None:
    # With no floating result there is no tangent to get wrong.
    if not any(jax.numpy.issubdtype(a.dtype, jax.numpy.inexact)
               for a in self.spec.result_avals):
      return
    if self.spec.jvp_error is not None:
      raise self.spec.jvp_error()

  def deliver(self, flat_args, context: host.CallContext):
    levels, avals = context.batch_levels, self.spec.result_avals
    if levels and self.spec.vmap_method in VECTORISED:
      # The callback is vectorised: one call with every batch axis in front.
      sizes = tuple(size for _, size in reversed(levels))
      avals = tuple(jax.core.ShapedArray(sizes + a.shape, a.dtype)
                    for a in avals)
      levels = ()

    def call_once(flat):
      args, kwargs = jax.tree_util.tree_unflatten(self.spec.in_tree, flat)
      result = self.spec.callback(*args, **kwargs)
      return results.check_results(
          result, self.spec.result_tree, avals,
          f"{self.spec.flavour}: the callback {self.name!r}")

    # Under vmap one host trip carries the batch; the callback sees one
    # element at a time, in index order, and the results are stacked.
    return call_per_element(call_once, list(flat_args), levels, len(avals))
