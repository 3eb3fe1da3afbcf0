"""Derivatives of a host call as host calls: forward rule, reverse rule.

``Derivatives`` describes one differentiable host function (its flat input
and output avals, which of them are differentiable, its two rules). Its
``jvp`` stages a ``LinearTarget`` call of the forward rule, linear in the
tangents; the transpose of that call is a ``LinearTarget`` call of the
reverse rule, and vice versa. The core primitive calls ``target.jvp`` and
``target.transpose``; nothing else here touches JAX internals.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hostcall import _jax_private
from hostcall._core.primitive import bind
from hostcall._core.targets import CallTarget, call_per_element, target
from hostcall._derivatives import rules
from hostcall._core.tangents import instantiate, is_inexact
from hostcall._core import results


@dataclasses.dataclass(frozen=True)
class Derivatives:
  """The derivative structure of one host function ``fn(*args, **kwargs)``.

  Differentiable inputs are the floating leaves of the positional
  arguments; keyword arguments are constants.
  """

  hostfn: rules.HostFunction
  in_tree: Any
  in_avals: tuple
  out_tree: Any
  out_avals: tuple

  @functools.cached_property
  def diff_in(self) -> tuple[bool, ...]:
    n_positional = len(jax.tree_util.tree_leaves(jax.tree_util.tree_unflatten(
        self.in_tree, list(range(len(self.in_avals))))[0]))
    return tuple(i < n_positional and is_inexact(a.dtype)
                 for i, a in enumerate(self.in_avals))

  @functools.cached_property
  def diff_out(self) -> tuple[bool, ...]:
    return tuple(is_inexact(a.dtype) for a in self.out_avals)

  @functools.cached_property
  def rules(self) -> tuple:
    """The (jvp, vjp) host rules, given or derived."""
    return rules.rules_for(self.hostfn, self.out_tree, self.out_avals)

  def linear_call(self, direction: str, residuals, linear) -> list:
    target = LinearTarget(self, direction)
    return bind(list(residuals) + list(linear), target=target, kind="call",
                result_avals=target.result_avals, ordering="pure")

  def jvp(self, primals, tangents) -> list:
    """Tangents of every output (float0 zeros for integer outputs)."""
    linear = [instantiate(t, a) for t, a, d in
              zip(tangents, self.in_avals, self.diff_in) if d]
    t_diff = iter(self.linear_call("jvp", primals, linear))
    return [next(t_diff) if d else
            _jax_private.Zero(a.to_tangent_aval())
            for a, d in zip(self.out_avals, self.diff_out)]


@target
class LinearTarget(CallTarget):
  """A host call of a derivative rule, linear in its trailing operands.

  ``"jvp"``: operands are the primals then the tangents of the
  differentiable inputs; results, the tangents of the differentiable
  outputs. ``"vjp"``: the primals then the cotangents of the differentiable
  outputs; results, the cotangents of the differentiable inputs.
  """

  derivs: Derivatives
  direction: str

  @functools.cached_property
  def rule(self):
    return self.derivs.rules[0 if self.direction == "jvp" else 1]

  @functools.cached_property
  def _second(self):
    """The rule's second argument (tangents of the inputs, or the cotangent
    of the result): avals, which come from the linear operands, and how to
    build it."""
    d = self.derivs
    if self.direction == "jvp":
      return (d.in_avals, d.diff_in, lambda full: tuple(
          jax.tree_util.tree_unflatten(d.in_tree, full)[0]))
    return (d.out_avals, d.diff_out, lambda full:
            jax.tree_util.tree_unflatten(d.out_tree, full))

  @functools.cached_property
  def _returns(self):
    """What the rule returns (a tangent of the result, or cotangents of the
    inputs): its tree, avals, and which of them are kept."""
    d = self.derivs
    if self.direction == "jvp":
      return d.out_tree, d.out_avals, d.diff_out
    positional = jax.tree_util.tree_structure(tuple(
        jax.tree_util.tree_unflatten(d.in_tree, list(d.in_avals))[0]))
    n_pos = positional.num_leaves
    return positional, d.in_avals[:n_pos], d.diff_in[:n_pos]

  @functools.cached_property
  def linear_avals(self) -> list:
    avals, mask, _ = self._second
    return [a for a, m in zip(avals, mask) if m]

  @functools.cached_property
  def result_avals(self) -> tuple:
    _, avals, mask = self._returns
    return tuple(a for a, m in zip(avals, mask) if m)

  def _second_operand(self, linear, zeros):
    avals, mask, build = self._second
    linear = iter(linear)
    return build([next(linear) if m else zeros(a.shape, a.dtype)
                  for a, m in zip(avals, mask)])

  def __repr__(self):
    return f"{self.direction}_rule({self.derivs.hostfn.__name__!r})"

  def vmap_method(self) -> str:
    return "sequential"

  def has_derivatives(self) -> bool:
    return True

  def _host_call(self, flat) -> list:
    d = self.derivs
    n = len(d.in_avals)
    args, kwargs = jax.tree_util.tree_unflatten(d.in_tree, list(flat[:n]))
    out = self.rule(tuple(args), self._second_operand(flat[n:], np.zeros),
                    **kwargs)
    expected_tree, expected_avals, mask = self._returns
    if self.direction == "vjp":
      # Cotangents of integer inputs are ignored, whatever the rule says.
      given = jax.tree_util.tree_leaves(out, is_leaf=lambda v: v is None)
      if len(given) == expected_tree.num_leaves:
        out = jax.tree_util.tree_unflatten(expected_tree, [
            g if m else np.zeros(a.shape, a.dtype)
            for g, a, m in zip(given, expected_avals, mask)])
    flat_out = results.check_results(
        out, expected_tree,
        [_jax_private.ShapedArray(a.shape, a.dtype) for a in expected_avals],
        f"the {self.direction} rule of {d.hostfn.__name__!r}")
    return [o for o, m in zip(flat_out, mask) if m]

  def deliver(self, flat_args, context):
    return call_per_element(self._host_call, list(flat_args),
                            context.batch_levels, len(self.result_avals))

  def transpose(self, cts, args) -> list:
    d = self.derivs
    n = len(d.in_avals)
    residuals = args[:n]
    if any(_jax_private.is_undefined_primal(r) for r in residuals):
      raise NotImplementedError(
          f"{self!r} can only be transposed in its tangent operands.")
    cts = [instantiate(c, a) for c, a in zip(cts, self.result_avals)]
    other = "vjp" if self.direction == "jvp" else "jvp"
    lin_cts = d.linear_call(other, residuals, cts)
    return [None] * n + list(lin_cts)

  def jvp(self, primals, tangents) -> list:
    d = self.derivs
    n = len(d.in_avals)
    residuals, linear = primals[:n], primals[n:]
    res_t, lin_t = tangents[:n], tangents[n:]
    out = []
    if any(type(t) is not _jax_private.Zero for t in lin_t):
      lin_t = [instantiate(t, a) for t, a in zip(lin_t, self.linear_avals)]
      out = d.linear_call(self.direction, residuals, lin_t)
    if any(type(t) is not _jax_private.Zero for t in res_t):
      second = self._residual_jvp(residuals, linear, res_t)
      out = second if not out else [a + b for a, b in zip(out, second)]
    if not out:
      out = [jnp.zeros(a.shape, a.dtype) for a in self.result_avals]
    return out

  def _residual_jvp(self, residuals, linear, res_t) -> list:
    """How the rule's output moves with the primals: the rule's own rule."""
    rule = self.rule
    if not isinstance(rule, rules.HostFunction):
      raise NotImplementedError(
          f"the {self.direction} rule of {self.derivs.hostfn.__name__!r} is "
          "not itself differentiable, so this derivative is of too high an "
          "order. For second order, give the rule as hostcall.HostFunction("
          "rule, jvp=..., vjp=...) with its own derivative rules.")
    d = self.derivs
    args, kwargs = jax.tree_util.tree_unflatten(d.in_tree, list(residuals))
    second = self._second_operand(linear, jnp.zeros)
    out_tree, out_avals, mask = self._returns
    rule_args = (tuple(args), second)
    flat_in, rule_in_tree = jax.tree_util.tree_flatten((rule_args, kwargs))
    rule_in_avals = [_jax_private.ShapedArray(np.shape(x), jnp.result_type(x))
                     for x in flat_in]
    rule_derivs = Derivatives(rule, rule_in_tree, tuple(rule_in_avals),
                              out_tree, tuple(out_avals))
    # Tangents: the positional primals move; the (co)tangent operand and the
    # keyword arguments do not.
    n_moving = len(jax.tree_util.tree_leaves(tuple(args)))
    flat_t = [res_t[i] if i < n_moving else _jax_private.Zero(rule_in_avals[i])
              for i in range(len(flat_in))]
    t_out = rule_derivs.jvp(flat_in, flat_t)
    return [instantiate(t, a) for t, a, m in zip(t_out, out_avals, mask)
            if m]
