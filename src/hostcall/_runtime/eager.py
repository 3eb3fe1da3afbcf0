"""A call outside ``jit``: ``hostcall_p``'s impl, registered here.

Outside ``jit`` the call is still compiled (a one-call program): the host
function then runs from the same runtime thread, sequenced by the same
effect tokens, as inside ``jit``. Under ``jax.disable_jit()``, and for a
target that asks for it (a debug callback, as JAX calls its own), the host
function runs right here instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from hostcall._core.context import make_context
from hostcall._core.primitive import hostcall_p
from hostcall._runtime import calls


@functools.lru_cache(maxsize=512)
def _compiled(**params):
  return jax.jit(functools.partial(hostcall_p.bind, **params))


def _impl(*args, **params):
  if jax.config.jax_disable_jit or params["target"].schedule.inline_outside_jit:
    return _run_inline(*args, **params)
  # Outside jit we still compile: the host function then runs from the same
  # runtime thread, sequenced by the same effect tokens, as inside jit.
  return _compiled(**params)(*args)


def is_eager_call(frame) -> bool:
  """Whether ``frame`` runs one call outside ``jit`` (``_impl``): as a
  computation of its own, apart from what comes before and after it."""
  return frame.f_code is _impl.__code__


def _run_inline(*args, target, transforms, kind, **_):
  """Called outside ``jit`` (under ``jax.disable_jit()``, or for a debug
  callback, as JAX calls its own): the host function runs right here."""
  devices = [d for a in args if isinstance(a, jax.Array) for d in a.devices()]
  device = devices[0] if devices else jax.devices()[0]
  results = calls.run(target, [_host_value(a) for a in args],
                      make_context(transforms, device))
  if kind == "tap":
    return list(args)
  return [jax.device_put(r, device) for r in results]


def _host_value(value):
  """What a host function receives for ``value`` outside ``jit``: a NumPy
  array with JAX's dtype (Python numbers narrowed as JAX narrows them), or
  an array of an extended dtype (a PRNG key) as it is."""
  if jax.dtypes.issubdtype(jnp.result_type(value), jax.dtypes.extended):
    return value
  array = np.asarray(value)
  return array.astype(jax.dtypes.canonicalize_dtype(array.dtype), copy=False)


hostcall_p.def_impl(_impl)
