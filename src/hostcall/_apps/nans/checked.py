"""``hostcall.find_nans``: a function run with a check after each
operation, forward and backward, that reports the first NaN or infinity.

The checked function is traced to a jaxpr (``jax.make_jaxpr``) inside a
``jax.jit`` and evaluated again by ``interpreter.Checker``, which checks
every output. Its differentiation is a ``jax.custom_vjp``: the forward rule
is ``jax.vjp`` of the checked evaluation (JAX differentiates each equation
as it would have; the checks ride along as integers), the backward rule
traces the pullback JAX made to a jaxpr and evaluates it checked too, so
that each backward operation is checked with the user's line of the
forward operation whose derivative it computes (JAX keeps it on what it
derives). Values the function closes over that another transformation
traces (a ``jax.grad`` around it, say) are explicit operands of the
``custom_vjp``, so that they are differentiated too. Each pass reports once
(``members.report``); a backward pass reports nothing for a member whose
forward pass found something, which ran first.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from hostcall import _jax_private
from hostcall._apps.nans import members
from hostcall._apps.nans.found import NOTHING
from hostcall._apps.nans.interpreter import Checker
from hostcall._apps.nans.preserving import non_finite_constant
from hostcall._apps.nans.region import Place
from hostcall._apps.nans.sites import Reporter, Site, Sites, check_on_nan
from hostcall._core.checks import check_callable, is_array_like


class _Static:
  """The non-array leaves of a call's arguments, a static argument of the
  ``jax.jit`` that runs the checked function: compared by value where they
  can be hashed, else by identity."""

  def __init__(self, leaves: tuple):
    self.leaves = leaves
    try:
      self._key = hash(leaves)
      self._by_value = True
    except TypeError:
      self._key = hash(tuple(id(v) for _, v in leaves))
      self._by_value = False

  def __hash__(self) -> int:
    return self._key

  def __eq__(self, other) -> bool:
    if not isinstance(other, _Static) or self._by_value != other._by_value:
      return False
    if self._by_value:
      return self.leaves == other.leaves
    return all(i == j and a is b for (i, a), (j, b)
               in zip(self.leaves, other.leaves)) and len(
                   self.leaves) == len(other.leaves)


def _input_names(fun: Callable, tree, static: dict) -> list[str]:
  """A name for each array leaf of a call's arguments: its parameter's name
  where ``fun``'s signature says it, and its place in the leaf."""
  try:
    params = [p.name for p in inspect.signature(fun).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):
    params = []
  names = []
  paths = jax.tree_util.tree_flatten_with_path(
      jax.tree_util.tree_unflatten(tree, range(tree.num_leaves)))[0]
  for i, (path, _) in enumerate(paths):
    if i in static:
      continue
    _, where, *rest = path  # (args or kwargs, then the argument)
    key = getattr(where, "idx", getattr(where, "key", None))
    if isinstance(key, int):
      name = params[key] if key < len(params) else f"args[{key}]"
    else:
      name = str(key)
    names.append(name + jax.tree_util.keystr(tuple(rest)))
  return names


def _check_inputs(region, values, names, phase: str) -> None:
  for value, name in zip(values, names):
    region.check(value, Site(phase, input=name))


def _checked_call(fun: Callable, on_nan, infs: bool, name: str, tree,
                  static: _Static, *dynamic):
  """``fun``'s result on the call's arguments (``tree``: their structure,
  ``static`` the non-array leaves, ``dynamic`` the arrays), checked."""
  fixed = dict(static.leaves)

  def flat_fun(*arrays):
    arrays = iter(arrays)
    leaves = [fixed[i] if i in fixed else next(arrays)
              for i in range(tree.num_leaves)]
    args, kwargs = jax.tree_util.tree_unflatten(tree, leaves)
    return fun(*args, **kwargs)

  closed, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(*dynamic)
  out_tree = jax.tree_util.tree_structure(out_shape)
  sites = Sites()
  reporter = Reporter(sites, name, on_nan)
  checker = Checker(sites, infs)
  names = _input_names(fun, tree, fixed)
  traced = [i for i, c in enumerate(closed.consts)
            if isinstance(c, _jax_private.Tracer)]
  n_args = len(dynamic)

  def forward(*operands):
    consts = list(closed.consts)
    for i, value in zip(traced, operands[n_args:]):
      consts[i] = value
    region = checker.new_region(checker.depth_of(closed.jaxpr))
    _check_inputs(region, operands[:n_args], names, "forward")
    # A constant known when traced is checked there; one that holds a NaN
    # is checked on the device too, so that the report says so.
    closed_over = [c for c in consts if isinstance(c, _jax_private.Tracer)
                   or non_finite_constant(c)]
    _check_inputs(region, closed_over, ["a value the function closes over"]
                  * len(closed_over), "forward")
    outs = checker.evaluate(closed.jaxpr, consts, operands[:n_args], region,
                            Place("forward"))
    return outs, region.found()

  checked = _differentiated_checked(forward, checker, reporter)
  outs = checked(*dynamic, *(closed.consts[i] for i in traced))
  return jax.tree_util.tree_unflatten(out_tree, outs)


def _instantiated(cotangent):
  """A cotangent JAX passed as a symbolic zero, made an array of zeros (a
  pullback takes arrays only)."""
  if not isinstance(cotangent, SymbolicZero):
    return cotangent
  if cotangent.dtype == jax.dtypes.float0:
    return np.zeros(cotangent.shape, cotangent.dtype)
  return jnp.zeros(cotangent.shape, cotangent.dtype)


def _differentiated_checked(forward: Callable, checker: Checker,
                            reporter: Reporter) -> Callable:
  """``forward``'s outputs, reported, as a ``jax.custom_vjp`` whose
  backward pass is checked and reported too. Only the operands JAX
  differentiates (``perturbed``) are differentiated: the others'
  cotangents would be computed, and checked, for nothing."""

  @jax.custom_vjp
  def checked(*operands):
    outs, found = forward(*operands)
    members.report(found, reporter)
    return outs

  def checked_forward(*primals):
    values = [p.value for p in primals]
    perturbed = [p.perturbed for p in primals]

    def of_perturbed(*differentiated):
      differentiated = iter(differentiated)
      return forward(*[next(differentiated) if p else v
                       for v, p in zip(values, perturbed)])

    outs, pullback, found = jax.vjp(
        of_perturbed, *[v for v, p in zip(values, perturbed) if p],
        has_aux=True)
    members.report(found, reporter)
    # Which operands are differentiated rides in the residuals' structure
    # (an empty tuple or None each), not as values.
    which = tuple(() if p else None for p in perturbed)
    return outs, (pullback, found.code > NOTHING, which)

  def checked_backward(residuals, cotangents):
    pullback, forward_found, which = residuals
    cotangents = jax.tree_util.tree_map(
        _instantiated, cotangents,
        is_leaf=lambda c: isinstance(c, SymbolicZero))
    closed = jax.make_jaxpr(pullback)(cotangents)
    region = checker.new_region(checker.depth_of(closed.jaxpr))
    flat = jax.tree_util.tree_leaves(cotangents)
    _check_inputs(region, flat, [f"the cotangent of output {i}"
                                 for i in range(len(flat))], "backward")
    grads = iter(checker.evaluate(closed.jaxpr, closed.consts, flat, region,
                                  Place("backward")))
    found = region.found()
    # A member whose forward pass found something reported that, first.
    found = found._replace(code=jnp.where(forward_found, NOTHING, found.code))
    members.report(found, reporter)
    return tuple(None if w is None else next(grads) for w in which)

  checked.defvjp(checked_forward, checked_backward, symbolic_zeros=True)
  return checked


def find_nans(fun: Callable, *, on_nan: str | Callable = "raise",
              infs: bool = True) -> Callable:
  """``fun``, compiled, reporting the first operation (forward, or backward
  under ``jax.grad``/``jax.vjp``) whose output holds a NaN or an infinity.

  Each call runs ``fun`` as ``jax.jit(fun)`` would, with a check after
  every operation computed on the device (one reduction over each floating
  output), and the first bad value found, if any, sent to the host by one
  asynchronous call: the device never waits for the host to look. Under
  ``jax.grad``/``jax.vjp`` the backward pass is checked the same way.
  Results and gradients are those of ``fun``, bit for bit.

  Arguments:
    fun: the function to check: traceable by ``jax.jit`` (its non-array
      arguments are static, as ``static_argnums`` would make them).
    on_nan: what a found NaN does on the host: ``"raise"`` (the default:
      it is logged when it arrives and the next ``hostcall.barrier()``
      raises ``hostcall.CallbackException`` from a ``FloatingPointError``
      whose ``report`` holds it), ``"warn"`` (a ``RuntimeWarning`` with the
      report's text), or a function called with the report
      (``reports.append``).
    infs: also report infinities (the default); ``False`` reports NaNs
      only (for programs that mask with ``-inf`` on purpose).

  Returns:
    A function of the same arguments as ``fun``, returning what it
    returns. Each call that finds something makes one report (a
    ``NanReport``), with these attributes: ``function`` (``fun``'s name),
    ``phase`` (``"forward"`` or ``"backward"``), ``value`` (``"NaN"`` or
    ``"infinity"``), ``primitive`` (``"log"``, ``"mul"``; None where an
    input already held it), ``input`` (that input: an argument such as
    ``"params['w']"``, a value ``fun`` closes over, or in the backward pass
    ``"the cotangent of output 0"``), ``where`` (the user's ``file:line``;
    in the backward pass, the forward line whose derivative it computes),
    ``steps`` (``(loop, step)`` for each enclosing ``scan`` or
    ``while_loop``, outermost first), ``member`` (the index at each
    ``vmap`` level, outermost first) and ``members`` (how many ``vmap``
    members found one). ``str(report)`` says it in one line, followed by
    the source line.

  Forward-mode differentiation of the result (``jax.jvp``, ``jax.jacfwd``,
  ``jax.hessian``) is refused, as for any ``jax.custom_vjp`` function:
  check the derivative itself, ``find_nans(jax.hessian(f))``. A
  ``while_loop``'s condition is not checked; a ``custom_jvp``/``custom_vjp``
  function's body is checked beside it, its rules kept.

  Example:
    >>> import jax, jax.numpy as jnp, hostcall
    >>> def f(x):
    ...   return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))
    >>> reports = []
    >>> g = jax.grad(hostcall.find_nans(f, on_nan=reports.append))(
    ...     jnp.array([1.0, 0.0])); hostcall.barrier()
    >>> r = reports[0]; (r.phase, r.primitive, r.value)
    ('backward', 'mul', 'NaN')
  """
  check_callable(fun, "find_nans's fun")
  check_on_nan(on_nan)
  if not isinstance(infs, bool):
    raise TypeError(f"find_nans: infs must be True or False, got {infs!r}.")
  name = getattr(fun, "__name__", None) or repr(fun)
  run = jax.jit(functools.partial(_checked_call, fun, on_nan, infs, name),
                static_argnums=(0, 1))

  @functools.wraps(fun)
  def checked(*args: Any, **kwargs: Any):
    flat, tree = jax.tree_util.tree_flatten((args, kwargs))
    static = tuple((i, leaf) for i, leaf in enumerate(flat)
                   if not is_array_like(leaf))
    arrays = [leaf for leaf in flat if is_array_like(leaf)]
    return run(tree, _Static(static), *arrays)

  return checked
