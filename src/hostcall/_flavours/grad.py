"""``hostcall.grad_callback`` and ``hostcall.grad_print``: host calls of the
backward pass.

A watched value passes through a ``jax.custom_vjp`` identity: its forward
pass makes no host call and saves the forward values handed to the host
function; its backward pass stages a debug callback (``debug.stage_debug``,
the same primitive and delivery as ``hostcall.debug_callback``) with the
cotangent reaching the value and those forward values, then passes the
cotangent on unchanged. ``on_backward`` is that identity for any staging
(``hostcall.metrics.Run.log_grad`` logs through it).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from hostcall import _jax_private
from hostcall._core import delivery as deliveries
from hostcall._core.checks import check_arguments, check_callable, is_array_like
from hostcall._flavours._stage import check_vmap_method
from hostcall._flavours.debug import make_printer, stage_debug


def _check_watched(x, who: str) -> None:
  leaves = jax.tree_util.tree_leaves(x)
  if not leaves:
    raise TypeError(f"{who}: x has no array to watch (got {x!r}); pass the "
                    "float value whose cotangent the host should see, e.g. "
                    f"h = {who}(fn, h).")
  for leaf in leaves:
    if not is_array_like(leaf) or not jnp.issubdtype(
        jnp.result_type(leaf), jnp.inexact):
      got = (f"dtype {jnp.result_type(leaf)}" if is_array_like(leaf)
             else f"a {type(leaf).__name__}")
      raise TypeError(
          f"{who}: x must hold floating (or complex) arrays, the values "
          f"a gradient flows through; got {got}. Integer and boolean values "
          "have no cotangent: watch a float value, and hand integers (a "
          f"step, an index) to the host function as arguments after x.")


def _ordering(ordered: bool) -> str:
  # Ordered (XLA may otherwise reorder the backward pass's independent
  # calls), except where the backward pass runs per device (shard_map,
  # pmap): there an ordered call in a transposed scan ran many times over
  # with JAX 0.12, and each device's loop keeps its steps' order anyway.
  if ordered and not _jax_private.collective_axis_names():
    return "ordered"
  return "unordered"


def on_backward(x: Any, args: Any, stage: Callable[[Any, Any], None]) -> Any:
  """``x`` unchanged; where the program is differentiated, its backward pass
  traces ``stage(cotangent_of_x, args)`` with the cotangent reaching ``x``
  and the forward values ``args`` (a pytree; non-array leaves are kept as
  they are), then passes the cotangent on unchanged.

  Arguments:
    x: a pytree of floating arrays.
    args: forward values the backward pass needs.
    stage: stages host calls (traced in the backward pass); its return
      value is ignored.

  Returns:
    ``x``.

  Example:
    >>> import jax, hostcall
    >>> from hostcall._flavours.grad import on_backward
    >>> stage = lambda ct, args: hostcall.debug_print("{} {}", ct, args)
    >>> _ = jax.grad(lambda x: 3.0 * on_backward(x, "ct", stage))(1.0)
    3.0 ct
  """
  flat, tree = jax.tree_util.tree_flatten(args)
  static = {i: leaf for i, leaf in enumerate(flat) if not is_array_like(leaf)}
  dynamic = [jnp.asarray(leaf) for leaf in flat if is_array_like(leaf)]

  def rebuilt(values):
    values = iter(values)
    return jax.tree_util.tree_unflatten(
        tree, [static[i] if i in static else next(values)
               for i in range(len(flat))])

  @jax.custom_vjp
  def watched(x, *dynamic):
    del dynamic
    return x

  def forward(x, *dynamic):
    return x, dynamic

  def backward(dynamic, cotangent):
    stage(cotangent, rebuilt(dynamic))
    # The forward values only ride along: no cotangent for them.
    return (cotangent, *[None] * len(dynamic))

  watched.defvjp(forward, backward)
  return watched(x, *dynamic)


def _delivery_now(delivery: str | None) -> str:
  # Fixed when the watched value is traced (the forward pass), as for every
  # tap: the backward pass may be traced after a ``hostcall.delivery``
  # block has closed.
  return deliveries.current() if delivery is None else deliveries.check(
      delivery)


def grad_callback(callback: Callable[..., None], x: Any, *args: Any,
                  ordered: bool = True, partitioned: bool = False,
                  vmap_method: str = "sequential",
                  delivery: str | None = None, **kwargs: Any) -> Any:
  """Returns ``x`` unchanged and calls ``callback(cotangent, *args,
  **kwargs)`` on the host in the backward pass, with the cotangent reaching
  ``x``.

  The forward pass makes no host call. Where the program is differentiated
  in reverse mode (``jax.grad``, ``jax.vjp``, ``jax.jacrev``), the backward
  pass calls ``callback`` when the cotangent of ``x`` is complete, in the
  backward pass's order (a loop's steps last first), and the cotangent
  passes on unchanged: the gradient is the same as without the call.

  Arguments:
    callback: called as ``callback(cotangent, *args, **kwargs)`` with NumPy
      arrays (non-array arguments as given: a name, say); the cotangent has
      ``x``'s structure. Its return value is ignored.
    x: the watched value: a float array or a pytree of them.
    *args, **kwargs: forward values handed to ``callback`` (a step index, a
      layer's name), saved by the forward pass.
    ordered: sequence the call with the other ordered callbacks (the
      default: the calls of one backward pass then reach the host in its
      order; with ``False`` the compiler may reorder calls that do not
      depend on each other, as for ``debug_callback``).
    partitioned: under ``jit`` of arrays sharded over several devices, one
      call per shard with the local shard of the cotangent (see
      ``debug_callback``).
    vmap_method: under ``vmap``, ``"sequential"`` (the default, as
      ``debug_callback``: one host trip carries the batch, ``callback`` is
      called once per element, in index order) or ``"expand_dims"`` /
      ``"broadcast_all"`` (one call with the batch axis in front).
    delivery: ``"sync"`` or ``"async"`` (the backward pass does not wait for
      ``callback``; ``hostcall.barrier()`` does); None: the delivery in
      force where ``grad_callback`` is traced (``hostcall.delivery``).

  Returns:
    ``x``.

  Forward mode (``jax.jvp``, ``jax.jacfwd`` of the watched value) has no
  backward pass and is refused, as JAX refuses ``jax.custom_vjp``
  functions; ``jax.hessian`` (forward over reverse) works. Under second
  order (``grad`` of ``grad``) ``callback`` sees the first-order cotangent,
  once per evaluation of the first backward pass. Under ``jax.checkpoint``
  it runs once per backward pass (the forward recomputation makes no
  call). Under ``shard_map`` and ``pmap`` each device calls with its own
  cotangent; ``hostcall.call_context().device`` says which. Inside
  ``hostcall.scan`` the backward pass's calls are made step by step, not
  buffered.

  Example:
    >>> import jax, hostcall
    >>> def f(x):
    ...   y = hostcall.grad_callback(lambda ct: print("dL/dy =", ct), 3.0 * x)
    ...   return y ** 2
    >>> g = jax.jit(jax.grad(f))(1.0); hostcall.barrier()
    dL/dy = 6.0
    >>> float(g)
    18.0
  """
  check_callable(callback, "grad_callback's callback")
  check_arguments(callback,
                  ["cotangent", *(f"arg{i}" for i in range(len(args)))],
                  dict.fromkeys(kwargs, None), "hostcall.grad_callback",
                  "grad_callback calls callback(cotangent, *args, **kwargs) "
                  "with the cotangent of x and the arguments given after x.")
  check_vmap_method(vmap_method)
  _check_watched(x, "hostcall.grad_callback")
  return _on_backward_call("grad_callback", callback, x, args, kwargs,
                           ordered, partitioned, vmap_method, delivery)


def grad_print(fmt: str, x: Any, *args: Any, ordered: bool = True,
               partitioned: bool = False, skip_format_check: bool = False,
               vmap_method: str = "sequential", delivery: str | None = None,
               **kwargs: Any) -> Any:
  """Returns ``x`` unchanged and prints ``fmt.format(cotangent, *args,
  **kwargs)`` in the backward pass, as ``debug_print`` formats.

  Arguments:
    fmt: a format string; its first positional field (``{}`` or ``{0}``)
      is the cotangent reaching ``x``, the next ones ``args``.
    x: the watched value: a float array or a pytree of them.
    *args, **kwargs: forward values to format (a step, a name).
    ordered, partitioned, vmap_method, delivery: as for ``grad_callback``.
    skip_format_check: do not check ``fmt`` against the arguments when
      tracing.

  Returns:
    ``x``.

  Example:
    >>> import jax, jax.numpy as jnp, hostcall
    >>> def f(x):
    ...   h = hostcall.grad_print("grad of h at step {1}: {0}", jnp.sin(x), 7)
    ...   return 2.0 * h
    >>> _ = jax.grad(f)(0.0); hostcall.barrier()
    grad of h at step 7: 2.0
  """
  if not isinstance(fmt, str):
    raise TypeError(f"grad_print's first argument is the format string, "
                    f"got {type(fmt).__name__}: hostcall.grad_print('grad "
                    "{}', x).")
  check_vmap_method(vmap_method)
  _check_watched(x, "hostcall.grad_print")
  printer = make_printer(fmt, (x, *args), kwargs, skip_format_check)
  return _on_backward_call("grad_print", printer, x, args, kwargs, ordered,
                           partitioned, vmap_method, delivery)


def _on_backward_call(flavour: str, fn: Callable, x, args: tuple,
                      kwargs: dict, ordered: bool, partitioned: bool,
                      vmap_method: str, delivery: str | None) -> Any:
  """``x``, whose backward pass stages ``fn(cotangent, *args, **kwargs)``
  as a debug call of ``flavour``, delivered as ``delivery`` says now."""
  mode = _delivery_now(delivery)

  def stage(cotangent, saved):
    saved_args, saved_kwargs = saved
    with deliveries.delivery(mode):
      stage_debug(flavour, fn, (cotangent, *saved_args), saved_kwargs,
                  _ordering(ordered), partitioned, vmap_method)

  return on_backward(x, (args, kwargs), stage)
