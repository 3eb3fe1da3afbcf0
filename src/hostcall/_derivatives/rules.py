"""Differentiating host functions: user rules, derived rules, finite differences.

A host function becomes differentiable when it carries rules, given as
``hostcall.HostFunction(fn, jvp=..., vjp=...)`` or as the ``jvp=`` / ``vjp=`` /
``finite_differences=`` options of ``hostcall.pure_callback`` and
``hostcall.io_callback``:

* ``jvp(primals, tangents, **kwargs) -> tangent_out``: forward mode, on the
  host. ``primals`` and ``tangents`` are tuples like the positional
  arguments; the result has the structure of the callback's result.
* ``vjp(primals, cotangent, **kwargs) -> cotangents``: reverse mode, on the
  host; one cotangent per positional argument (``None`` for an integer one).
* Either one suffices: the other is derived on the host by building the
  Jacobian from it (one rule call per output element, or per input element).
* ``finite_differences=True`` (or a step): central differences of the host
  function itself, evaluated in float64 (see ``fd_step``).

Keyword arguments of the callback are constants for differentiation: a
gradient never flows into them. Pass differentiable values positionally.

Mechanism: the JVP of the call is one more host call, of the forward rule,
linear in the tangents; its transpose is a host call of the reverse rule (and
the reverse rule's transpose is the forward one). Both are ``hostcall_p``
equations with batching and transposition rules of their own, so ``grad``
never transposes an opaque callback (jax issue 30401), ``jacfwd``/``jacrev``
batch the rule calls, and a rule that is itself a ``HostFunction`` with rules
gives second order (jax issue 16650).
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import numpy as np

from hostcall._core.tangents import is_inexact
from hostcall._core.checks import check_callable


def fd_step(x: np.ndarray, direction: np.ndarray) -> float:
  """The central-difference step along ``direction`` at ``x``.

  ``h = eps**(1/3) * max(1, max|x|) / max|direction|`` with float64's eps,
  about 6e-6 relative: the truncation error (``h**2``) and the rounding error
  (``eps / h``) are then balanced, each about 4e-11 relative for a smooth
  function evaluated in float64.

  Arguments:
    x: the point (all floating inputs, flattened).
    direction: the tangent along which to differentiate, shaped like ``x``.

  Returns:
    The step ``h``: the host function is evaluated at ``x ± h * direction``.

  Example:
    >>> import numpy as np, hostcall
    >>> float(hostcall.fd_step(np.array([1.0, 2.0]), np.array([1.0, 0.0])))
    1.21109...e-05
  """
  scale = max(1.0, float(np.max(np.abs(x), initial=0.0)))
  norm = float(np.max(np.abs(direction), initial=0.0))
  return np.finfo(np.float64).eps ** (1 / 3) * scale / max(norm, 1e-300)


class HostFunction:
  """A host function with derivative rules, usable as a hostcall callback.

  Arguments:
    fn: the host function, called with NumPy arrays.
    jvp: ``jvp(primals, tangents, **kwargs) -> tangent_out`` on the host.
    vjp: ``vjp(primals, cotangent, **kwargs) -> cotangents`` on the host.
    finite_differences: ``True`` for central differences with ``fd_step``, or
      a float step used as is (relative to ``max(1, |x|)``).

  A rule may itself be a ``HostFunction`` with rules: that gives second
  order (``jax.hessian``, Hessian-vector products).

  Example:
    >>> import jax, numpy as np, hostcall
    >>> sin = hostcall.HostFunction(np.sin, vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    >>> f = lambda x: hostcall.pure_callback(sin, x, x)
    >>> float(jax.grad(f)(0.0))
    1.0
  """

  def __init__(self, fn: Callable, *, jvp: Callable | None = None,
               vjp: Callable | None = None,
               finite_differences: bool | float | None = None):
    check_callable(fn, "HostFunction's fn")
    for name, rule in (("jvp", jvp), ("vjp", vjp)):
      if rule is not None:
        check_callable(rule, f"HostFunction's {name} rule")
    if jvp is None and vjp is None and not finite_differences:
      raise TypeError(
          "HostFunction needs a derivative: pass jvp=, vjp= (host rules) or "
          "finite_differences=True.")
    if (jvp is not None or vjp is not None) and finite_differences:
      raise TypeError("HostFunction: pass host rules (jvp=/vjp=) or "
                      "finite_differences, not both.")
    self.fn, self.jvp, self.vjp = fn, jvp, vjp
    self.finite_differences = finite_differences
    self.__name__ = getattr(fn, "__name__", repr(fn))

  def __call__(self, *args, **kwargs):
    return self.fn(*args, **kwargs)

  def __repr__(self):
    return f"HostFunction({self.__name__})"


def _float64(x):
  x = np.asarray(x)
  return x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x


class _FiniteDifferenceJvp:
  """``jvp(primals, tangents)`` by central differences of ``fn``."""

  def __init__(self, fn, step, out_tree, out_avals):
    self.fn, self.step = fn, step
    self.out_tree, self.out_avals = out_tree, out_avals
    self.__name__ = f"finite_difference_jvp({getattr(fn, '__name__', fn)})"

  def __call__(self, primals, tangents, **kwargs):
    flat_x, tree = jax.tree_util.tree_flatten(primals)
    flat_t = jax.tree_util.tree_leaves(tangents)
    x64 = [_float64(x) for x in flat_x]
    t64 = [_float64(t) if np.issubdtype(x.dtype, np.floating)
           else np.zeros_like(x) for x, t in zip(x64, flat_t)]
    floats = [x for x in x64 if np.issubdtype(x.dtype, np.floating)]
    whole_x = np.concatenate([x.ravel() for x in floats] or [np.zeros(0)])
    whole_t = np.concatenate([t.ravel() for x, t in zip(x64, t64)
                              if np.issubdtype(x.dtype, np.floating)]
                             or [np.zeros(0)])
    if not np.any(whole_t):
      return jax.tree_util.tree_unflatten(
          self.out_tree, [np.zeros(a.shape, a.dtype) for a in self.out_avals])
    h = (fd_step(whole_x, whole_t) if self.step is True
         else float(self.step) * max(1.0, float(np.max(np.abs(whole_x),
                                                       initial=0.0))))

    def at(sign):
      shifted = [x + sign * h * t if np.issubdtype(x.dtype, np.floating)
                 else x for x, t in zip(x64, t64)]
      out = self.fn(*jax.tree_util.tree_unflatten(tree, shifted), **kwargs)
      return [np.asarray(o, np.float64) for o in
              jax.tree_util.tree_leaves(out)]

    plus, minus = at(+1.0), at(-1.0)
    flat = [((p - m) / (2 * h)).astype(a.dtype)
            for p, m, a in zip(plus, minus, self.out_avals)]
    return jax.tree_util.tree_unflatten(self.out_tree, flat)


class _JvpFromVjp:
  """``jvp`` from a ``vjp`` rule: rows of the Jacobian, one call each."""

  def __init__(self, vjp, out_tree, out_avals):
    self.vjp, self.out_tree, self.out_avals = vjp, out_tree, out_avals
    self.__name__ = f"jvp_from_vjp({getattr(vjp, '__name__', vjp)})"

  def __call__(self, primals, tangents, **kwargs):
    flat_t = [np.asarray(t) for t in jax.tree_util.tree_leaves(tangents)]
    outs = []
    for k, aval in enumerate(self.out_avals):
      column = np.zeros(math.prod(aval.shape), aval.dtype)
      for i in range(column.size):
        basis = [np.zeros(a.shape, a.dtype) for a in self.out_avals]
        basis[k].reshape(-1)[i] = 1
        cts = jax.tree_util.tree_unflatten(self.out_tree, basis)
        row = _leaves_like(self.vjp(primals, cts, **kwargs), flat_t)
        column[i] = sum(np.vdot(r, t).real if not np.iscomplexobj(column)
                        else np.vdot(r, t) for r, t in zip(row, flat_t))
      outs.append(column.reshape(aval.shape))
    return jax.tree_util.tree_unflatten(self.out_tree, outs)


class _VjpFromJvp:
  """``vjp`` from a ``jvp`` rule: columns of the Jacobian, one call each."""

  def __init__(self, jvp, name):
    self.jvp = jvp
    self.__name__ = f"vjp_from_jvp({name})"

  def __call__(self, primals, cotangent, **kwargs):
    flat_x, tree = jax.tree_util.tree_flatten(primals)
    flat_ct = [np.asarray(c) for c in jax.tree_util.tree_leaves(cotangent)]
    grads = []
    for j, x in enumerate(flat_x):
      x = np.asarray(x)
      grad = np.zeros(x.shape, x.dtype if is_inexact(x.dtype) else np.float32)
      if is_inexact(x.dtype):
        for i in range(x.size):
          basis = [np.zeros(np.shape(v), np.asarray(v).dtype) for v in flat_x]
          basis[j].reshape(-1)[i] = 1
          column = jax.tree_util.tree_leaves(self.jvp(
              primals, jax.tree_util.tree_unflatten(tree, basis), **kwargs))
          grad.reshape(-1)[i] = sum(np.vdot(np.asarray(c), ct).real
                                    for c, ct in zip(column, flat_ct))
      grads.append(grad)
    return jax.tree_util.tree_unflatten(tree, grads)


def _leaves_like(cotangents, like) -> list[np.ndarray]:
  leaves = jax.tree_util.tree_leaves(
      cotangents, is_leaf=lambda v: v is None)
  return [np.zeros(np.shape(t)) if c is None else np.asarray(c)
          for c, t in zip(leaves, like)]


class _VjpNormalised:
  """A plain ``vjp`` rule whose ``None`` entries (integer inputs) become zeros
  and whose result is a tuple like the positional arguments."""

  def __init__(self, vjp):
    self.vjp = vjp
    self.__name__ = getattr(vjp, "__name__", repr(vjp))

  def __call__(self, primals, cotangent, **kwargs):
    cts = self.vjp(primals, cotangent, **kwargs)
    if not isinstance(cts, (tuple, list)) or len(cts) != len(primals):
      raise TypeError(
          f"the vjp rule {self.__name__!r} must return a tuple with one "
          f"cotangent per positional argument ({len(primals)}), got "
          f"{type(cts).__name__} {cts!r:.200}.")
    out = []
    for ct, p in zip(cts, primals):
      if ct is None:
        out.append(jax.tree_util.tree_map(np.zeros_like, p))
      else:
        out.append(ct)
    return tuple(out)


def rules_for(hostfn: HostFunction, out_tree, out_avals):
  """The (jvp, vjp) host functions to stage for ``hostfn``."""
  if hostfn.finite_differences:
    jvp = _FiniteDifferenceJvp(hostfn.fn, hostfn.finite_differences,
                               out_tree, out_avals)
    return jvp, _VjpFromJvp(jvp, hostfn.__name__)
  jvp, vjp = hostfn.jvp, hostfn.vjp
  if vjp is not None and not isinstance(vjp, HostFunction):
    vjp = _VjpNormalised(vjp)
  if jvp is None:
    jvp = _JvpFromVjp(vjp, out_tree, out_avals)
  if vjp is None:
    vjp = _VjpFromJvp(jvp, hostfn.__name__)
  return jvp, vjp


