"""``hostcall.io_callback``: ``jax.experimental.io_callback`` without its walls."""

from __future__ import annotations

from typing import Any, Callable

from hostcall._flavours import _stage


def _ordered_vmap_refused():
  return ValueError(
      "Cannot `vmap` ordered IO callback. hostcall: pass "
      "vmap_method='sequential' (one call per batch element, in index order) "
      "or 'expand_dims' / 'broadcast_all' (one call with the whole batch) to "
      "hostcall.io_callback.")


def _no_jvp():
  return ValueError(
      "IO callbacks do not support JVP. hostcall: this io_callback returns "
      "results that a derivative needs; pass jvp= and/or vjp= (host rules) or "
      "finite_differences=True, or differentiable=False if its results are "
      "constants for differentiation.")


def io_callback(callback: Callable[..., Any], result_shape_dtypes: Any,
                *args: Any, sharding=None, ordered: bool = False,
                vmap_method: str | None = None, jvp: Callable | None = None,
                vjp: Callable | None = None,
                finite_differences: bool | float | None = None,
                differentiable: bool = True, partitioned: bool = False,
                **kwargs: Any):
  """Calls an impure host function; ``jax.experimental.io_callback``'s drop-in.

  The callback always runs, even when its result is unused, and with
  ``ordered=True`` in program order with every other ordered hostcall.

  Arguments:
    callback: the host function, called as ``callback(*args, **kwargs)``
      with NumPy arrays.
    result_shape_dtypes: a pytree of ``jax.ShapeDtypeStruct`` (or ``None``).
    *args, **kwargs: arrays (pytrees of) passed to the callback.
    sharding: a ``SingleDeviceSharding``: the calling device under a global
      view of several devices.
    ordered: sequence this call with the other ordered callbacks.
    vmap_method: hostcall's extra. Under ``vmap`` JAX calls an unordered
      callback once per element and refuses an ordered one
      (``ValueError: Cannot `vmap` ordered IO callback.``), which is what
      ``None`` does. ``"sequential"``: one call per element in index order,
      ordered or not. ``"expand_dims"`` / ``"broadcast_all"``: one call with
      the whole batch in front.
    jvp, vjp, finite_differences: hostcall's extras, derivative rules as for
      ``hostcall.pure_callback``; the callback itself still runs once per
      primal evaluation.
    differentiable: hostcall's extra; ``False`` declares the results
      constants for differentiation (zero tangents), so the call runs under
      ``grad`` on primal values.
    partitioned: hostcall's extra, for a callback without results: under
      ``jit`` of arrays sharded over several devices, one call per shard
      with the local shard (no all-gather), its place in
      ``hostcall.call_context().shard_indices``; not ordered.

  Returns:
    The callback's result, as JAX arrays in the ``result_shape_dtypes`` tree.

  A callback with no result, or one that does not depend on differentiated
  values, runs under ``jvp``/``grad`` once per primal evaluation. One whose
  results feed a derivative raises JAX's ``IO callbacks do not support JVP.``
  with the option to add, never a silently wrong derivative. Inside a
  ``while_loop`` whose predicate is batched the callback runs at every
  iteration for the whole batch, lanes already finished included.

  Example:
    >>> import jax, jax.numpy as jnp, hostcall
    >>> log = []
    >>> def record(x):
    ...   log.append(x.tolist())
    >>> f = lambda x: hostcall.io_callback(record, None, x, ordered=True,
    ...                                    vmap_method="sequential")
    >>> jax.vmap(f)(jnp.arange(3)); hostcall.barrier(); log
    [0, 1, 2]
  """
  _stage.check_vmap_method(vmap_method)
  if vmap_method is None and not ordered:
    vmap_method = "sequential"  # JAX maps an unordered one element-wise
  callback = _stage.with_rules(callback, jvp, vjp, finite_differences)
  return _stage.stage("io_callback", callback, result_shape_dtypes, args,
                      kwargs, ordering="io_ordered" if ordered else "io",
                      sharding=sharding, partitioned=partitioned,
                      vmap_method=vmap_method,
                      vmap_error=_ordered_vmap_refused,
                      jvp_error=_no_jvp if differentiable else None)
