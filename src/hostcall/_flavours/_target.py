"""The host side of a modern callback: unbatching, calling, checking."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np

from hostcall import _jax_private
from hostcall._core.context import CallContext
from hostcall._core.targets import (VECTORISED, CallTarget, Schedule,
                                   call_per_element,
                                    is_positional, key_of, target)
from hostcall._core import results

VMAP_METHODS = ("sequential", "sequential_unrolled", *VECTORISED,
                "concurrent")

_JAX_NAMES = {"debug_callback": "jax.debug.callback",
              "debug_print": "jax.debug.callback"}

#: Flavours called for their effect, as JAX's debug callbacks (the grad
#: flavours' calls are debug callbacks of the backward pass).
_DEBUG_LIKE = ("debug_callback", "debug_print", "grad_callback", "grad_print")
# Called outside jit, JAX's debug callbacks run right away.
_INLINE, _DEFAULT = Schedule(inline_outside_jit=True), Schedule()
_GATABLE = (*_DEBUG_LIKE, "io_callback")


@target
class CallbackTarget(CallTarget):
  """Calls ``callback(*args, **kwargs)`` with NumPy arrays on the host.

  Attributes:
    flavour: ``"pure_callback"``, ``"io_callback"``, ``"debug_callback"``,
      ``"debug_print"``, ``"grad_callback"`` or ``"grad_print"``.
    callback: the user's function (compared by ``hash_key``).
    in_tree: the pytree of ``(args, kwargs)``.
    result_tree, result_avals: what the callback returns.
    method: the ``vmap_method``; None: ``vmap`` is refused with
      ``vmap_error()``.
    vmap_error, jvp_error: build the exception raised by a refused ``vmap``
      and by a non-zero tangent reaching a call without derivative rules
      (``jvp_error`` None: its results are constants).
    derivatives: a ``hostcall._derivatives.linear.Derivatives``, when rules
      were given.
  """

  flavour: str
  callback: Callable = dataclasses.field(compare=False)
  in_tree: Any
  result_tree: Any
  result_avals: tuple
  method: str | None
  vmap_error: Callable[[], Exception] | None = None
  jvp_error: Callable[[], Exception] | None = None
  derivatives: Any = None
  callback_key: Any = key_of("callback")

  @property
  def remat(self) -> str:
    return "debug" if self.flavour in _DEBUG_LIKE else "again"

  @property
  def schedule(self) -> Schedule:
    return _INLINE if self.flavour in _DEBUG_LIKE else _DEFAULT

  @property
  def gatable(self) -> bool:
    # JAX's impure flavours: under vmap of a cond, only the lanes that took
    # the branch (a pure callback may run for any lane, as in JAX).
    return self.flavour in _GATABLE

  @property
  def name(self) -> str:
    return getattr(self.callback, "__name__", repr(self.callback))

  def __repr__(self):
    return f"{self.flavour}({self.name!r})"

  @property
  def who(self) -> str:
    """The callback, as a failed check of its results names it: its name
    and where it is defined (a lambda's name alone says little)."""
    where = _defined_at(self.callback)
    return f"{self.label}: the callback {self.name!r}{where}"

  @property
  def label(self) -> str:
    return f"hostcall.{self.flavour}"

  @property
  def jax_name(self) -> str | None:
    if self.flavour.startswith("grad"):
      return None  # no JAX function of that name: logged as hostcall's
    return _JAX_NAMES.get(self.flavour, f"jax.{self.flavour}")

  def vmap_method(self) -> str:
    if self.method is None:
      raise self.vmap_error()
    return self.method

  def has_derivatives(self) -> bool:
    return self.derivatives is not None

  def jvp(self, primals, tangents):
    if self.derivatives is None:
      return None
    return self.derivatives.jvp(primals, tangents)

  def transpose(self, cts, args):
    del cts
    if self.flavour == "io_callback":
      raise ValueError("IO callbacks do not support transpose.")
    if self.flavour == "pure_callback":
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
               for a in self.result_avals):
      return
    if self.jvp_error is not None:
      raise self.jvp_error()

  def deliver(self, flat_args, context: CallContext):
    levels, avals = context.batch_levels, self.result_avals
    call_once, gates = self._call_once, context.gates
    if gates:
      call_once = functools.partial(self._call_if_taken, gates)
    if levels and self.method in VECTORISED:
      # The callback is vectorised: one call with every batch axis in front.
      sizes = tuple(size for _, size in reversed(levels))
      avals = tuple(_jax_private.ShapedArray(sizes + a.shape, a.dtype)
                    for a in avals)
      levels = ()
      if gates:
        call_once = functools.partial(self._call_if_any_taken, gates)

    if not levels:
      return call_once(flat_args, avals)
    # Under vmap one host trip carries the batch; the callback sees one
    # element at a time, in index order, and the results are stacked.
    return call_per_element(lambda flat: call_once(flat, avals),
                            list(flat_args), levels, len(avals),
                            concurrent=self.method == "concurrent")

  def _call_if_taken(self, gates, flat, avals) -> list:
    # A lane that did not take the branch holding the call: no call (a
    # gated call has no results: see gating).
    flat, taken = flat[:-gates], flat[-gates:]
    if all(bool(t) for t in taken):
      return self._call_once(flat, avals)
    return [np.zeros(a.shape, a.dtype) for a in avals]

  def _call_if_any_taken(self, gates, flat, avals) -> list:
    # A vectorised callback gets the whole batch once, if any lane took the
    # branch. Each gate has the batch axes of the vmaps outside its cond in
    # front (outermost first): lined up on the left, they must all hold.
    flat, flags = flat[:-gates], flat[-gates:]
    rank = max(np.ndim(f) for f in flags)
    taken = functools.reduce(np.logical_and, [
        np.reshape(f, np.shape(f) + (1,) * (rank - np.ndim(f)))
        for f in flags])
    if np.any(taken):
      return self._call_once(flat, avals)
    return [np.zeros(a.shape, a.dtype) for a in avals]

  def caller(self, context: CallContext):
    if context.batch_levels or self.result_avals or not is_positional(
        self.in_tree):
      return super().caller(context)
    # The common queued call: the callback on its flat arguments; a debug
    # callback's own function directly (its result is ignored anyway).
    direct = getattr(type(self.callback), "direct_form", None)
    if direct is not None:
      return direct(self.callback)
    callback = self.callback

    def call(*flat):
      result = callback(*flat)
      if result is not None:
        results.check_results(result, self.result_tree, (), self.who)
    return call

  def lines_writer(self, context: CallContext):
    if (self.flavour not in ("debug_print", "debug_callback")
        or context.batch_levels
        or context.gates or self.result_avals
        or not is_positional(self.in_tree)):
      return None
    direct = getattr(type(self.callback), "direct_form", None)
    printer = direct(self.callback) if direct is not None else None
    # (Of the printer's type: a user's function whose attributes answer
    # any name, a mock, is called as any other.)
    return printer if hasattr(type(printer), "lines_of") else None

  def _call_once(self, flat, avals) -> list:
    args, kwargs = jax.tree_util.tree_unflatten(self.in_tree, flat)
    result = self.callback(*args, **kwargs)
    if result is None and not avals:
      return []  # the common case: a callback for its effect
    return results.check_results(result, self.result_tree, avals, self.who)


def _defined_at(fn) -> str:
  """`` (defined at file:line)`` of a Python function (through
  ``functools.partial``), else empty."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  code = getattr(fn, "__code__", None)
  if code is None:
    return ""
  return f" (defined at {code.co_filename}:{code.co_firstlineno})"
