"""hostcall: host-side Python from inside compiled JAX programs.

Public API:

* ``hostcall.pure_callback``, ``hostcall.io_callback``,
  ``hostcall.debug_callback``, ``hostcall.debug_print``: drop-in
  replacements for JAX's callbacks, with extra options that remove their
  walls (derivative rules, finite differences, ordered callbacks under
  ``vmap``, io callbacks under ``grad``).
* ``hostcall.grad_callback``, ``hostcall.grad_print``: host calls and
  prints of the backward pass, with the cotangent reaching a value.
* ``hostcall.HostFunction``: a host function with derivative rules.
* ``hostcall.host_callback``: the legacy ``jax.experimental.host_callback``
  API (``id_tap``, ``id_print``, ``call``, ``barrier_wait``) on modern JAX.
* ``hostcall.barrier()``: wait for every callback started so far and raise
  what tap functions (and asynchronous result-less calls) raised.
* ``hostcall.set_delivery`` / ``hostcall.delivery``: synchronous taps (the
  default) or asynchronous ones (queued, delivered by a host thread, the
  device never waiting for Python); ``hostcall.set_queue_capacity``,
  ``hostcall.set_gather_window``, ``hostcall.queue_stats``.
* ``hostcall.jit``: ``jax.jit`` whose taps, prints and metrics rows become
  outputs, so that a jitted step with them dispatches at a plain step's
  speed.
* ``hostcall.scan``: ``lax.scan`` whose taps reach the host K steps at a
  time (loop-buffered delivery).
* ``hostcall.progress``: progress bars for ``scan``, ``fori_loop`` and
  ``while_loop`` under ``jit``, ``vmap`` and several devices.
* ``hostcall.metrics``: metrics logged from inside ``jit`` to JSON Lines,
  CSV, TensorBoard or a DataFrame, and plotted to PNG.
* ``hostcall.control``: stop a running compiled loop from the host (Ctrl-C,
  a time limit, a predicate such as a loss plateau) and keep its state.
* ``hostcall.call_context()``: inside a host function, which device and
  process called it and under which transformations.
* ``hostcall.CallbackException``, ``hostcall.CallContext``,
  ``hostcall.fd_step``, ``hostcall.HostcallNativeError`` (the native
  extension is missing: install hostcall).
"""

from hostcall import (_jax_private, _notebook, control, host_callback, metrics,
                      progress)
from hostcall._apps.scan import scan
from hostcall._apps.nans import find_nans
import atexit as _atexit

from hostcall._runtime import tap_queue as _queue
from hostcall._core.delivery import delivery, set_delivery
from hostcall._runtime.queue_settings import (queue_stats,
                                              set_gather_window,
                                              set_queue_capacity)
from hostcall._core import CallContext, call_context
from hostcall._runtime import CallbackException, barrier
from hostcall._runtime.libraries import HostcallNativeError
from hostcall._runtime.dispatch_hint import SlowDispatchWarning
from hostcall._runtime.errors import (HostFunctionError, original_error,
                                      original_errors)
from hostcall._derivatives.rules import HostFunction, fd_step
from hostcall._flavours.debug import debug_callback, debug_print
from hostcall._flavours.grad import grad_callback, grad_print
from hostcall._flavours.io import io_callback
from hostcall._jit.jitted import jit
from hostcall._flavours.pure import pure_callback

# Every host call started before the interpreter exits is delivered: the
# wait is registered now, when hostcall is imported, so that it runs after
# every exit handler registered later (atexit runs the last registered
# first), host calls made in those included. Runs before the metrics runs
# are closed (their hook was registered while importing, earlier).
_atexit.register(_queue.wait_at_exit)

__version__ = "0.1.0"

_notebook.install()  # inside IPython: each cell's host output in that cell
# Errors raised while JAX traces a user's function show the user's frames,
# not hostcall's (as JAX hides its own). Every folder of the package: an
# editable install's Python files are not where its extension is.
for _folder in __path__:
  _jax_private.hide_frames_of(_folder)
del _folder

__all__ = [
    "CallContext",
    "CallbackException",
    "HostFunction",
    "HostFunctionError",
    "HostcallNativeError",
    "SlowDispatchWarning",
    "__version__",
    "barrier",
    "call_context",
    "control",
    "delivery",
    "queue_stats",
    "set_delivery",
    "set_gather_window",
    "set_queue_capacity",
    "debug_callback",
    "debug_print",
    "fd_step",
    "find_nans",
    "grad_callback",
    "grad_print",
    "host_callback",
    "io_callback",
    "jit",
    "metrics",
    "original_error",
    "original_errors",
    "progress",
    "pure_callback",
    "scan",
]
