"""hostcall: host-side Python from inside compiled JAX programs.

Public API:

* ``hostcall.host_callback``: the legacy ``jax.experimental.host_callback``
  API (``id_tap``, ``id_print``, ``call``, ``barrier_wait``) on modern JAX.
* ``hostcall.barrier()``: wait for every callback started so far and raise
  what tap functions raised.
* ``hostcall.CallbackException``, ``hostcall.CallContext``.
"""

from hostcall import host_callback
from hostcall._core import CallbackException, CallContext, barrier

__version__ = "0.1.0"

__all__ = [
    "CallContext",
    "CallbackException",
    "__version__",
    "barrier",
    "host_callback",
]
