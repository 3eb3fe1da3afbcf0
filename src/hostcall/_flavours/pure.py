"""``hostcall.pure_callback``: ``jax.pure_callback``, differentiable on request."""

from __future__ import annotations

from typing import Any, Callable

from hostcall._flavours import _stage


def _vmap_refused():
  return NotImplementedError(
      "vmap is only supported for the pure_callback primitive when "
      "vmap_method is one of 'sequential', 'sequential_unrolled', "
      "'expand_dims', 'broadcast_all', or 'legacy_vectorized'. Got "
      "vmap_method=None.")


def _no_jvp():
  return ValueError(
      "Pure callbacks do not support JVP. Please use `jax.custom_jvp` to use "
      "callbacks while taking gradients. hostcall: or pass jvp= and/or vjp= "
      "(host derivative rules) or finite_differences=True to "
      "hostcall.pure_callback.")


def pure_callback(callback: Callable[..., Any], result_shape_dtypes: Any,
                  *args: Any, sharding=None, vmap_method: str | None = None,
                  jvp: Callable | None = None, vjp: Callable | None = None,
                  finite_differences: bool | float | None = None,
                  **kwargs: Any):
  """Calls a pure host function; ``jax.pure_callback``'s drop-in.

  With no extra option it behaves as ``jax.pure_callback``: same arguments,
  results and errors, except that the callback receives NumPy arrays (JAX's
  hands it CPU ``jax.Array``s, at about 100 µs a call).

  Arguments:
    callback: the host function, called as ``callback(*args, **kwargs)``
      with NumPy arrays; it must be pure (JAX may elide or repeat it).
    result_shape_dtypes: a pytree of ``jax.ShapeDtypeStruct`` (or anything
      with ``shape`` and ``dtype``) describing the result.
    *args, **kwargs: arrays (pytrees of) passed to the callback.
    sharding: a ``SingleDeviceSharding``: the device that calls under a global
      view of several devices.
    vmap_method: as in JAX. ``"sequential"`` / ``"sequential_unrolled"``:
      one call per batch element, in index order (hostcall sends the whole
      batch in one host trip). ``"expand_dims"`` / ``"broadcast_all"``: one
      call with the batch axis in front. ``None``: ``vmap`` raises.
      hostcall's extra, ``"concurrent"``: one call per batch element, as
      ``"sequential"``, but run at the same time by a pool of threads
      (for a host function that waits: I/O, a subprocess, a library that
      releases the GIL); the results in index order, and a failure raises
      the first failing element's exception, as in index order.
    jvp: hostcall's extra: ``jvp(primals, tangents, **kwargs)`` on the host.
    vjp: hostcall's extra: ``vjp(primals, cotangent, **kwargs)`` on the host.
    finite_differences: hostcall's extra: ``True`` (or a relative step) to
      differentiate the black box numerically, by central differences in
      float64 (see ``hostcall.fd_step``).

  Returns:
    The callback's result, as JAX arrays in the ``result_shape_dtypes`` tree.

  With ``jvp``/``vjp``/``finite_differences`` (or a ``hostcall.HostFunction``
  callback) the call works under ``grad``, ``jacfwd``, ``jacrev``, ``vmap`` of
  ``grad``; without them ``jvp``/``grad`` raise JAX's error plus the option to
  add. ``jvp``, ``vjp`` and ``finite_differences`` are therefore reserved
  keyword names: they are not passed to the callback.

  Example:
    >>> import jax, jax.numpy as jnp, numpy as np, hostcall
    >>> f = lambda x: hostcall.pure_callback(
    ...     np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
    ...     vjp=lambda p, ct: (np.cos(p[0]) * ct,))
    >>> jax.grad(lambda x: f(x).sum())(jnp.zeros(2))
    Array([1., 1.], dtype=float32)
  """
  _stage.check_vmap_method(vmap_method)
  callback = _stage.with_rules(callback, jvp, vjp, finite_differences)
  return _stage.stage("pure_callback", callback, result_shape_dtypes, args,
                      kwargs, ordering="pure", sharding=sharding,
                      vmap_method=vmap_method, vmap_error=_vmap_refused,
                      jvp_error=_no_jvp)
