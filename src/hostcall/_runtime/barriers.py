"""Waiting for everything sent to the host, and what applications do then.

``wait_without_raising()`` waits until every call started so far has run on
the host
(running computations, then the asynchronous queue, transitively) and runs
the barrier hooks (applications flush rows, close orphaned bars);
``barrier()`` does the same and raises what taps raised since the last one.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from typing import Callable

from hostcall import _jax_private
from hostcall._runtime import calls, dispatch_stdout, errors, tap_queue
from hostcall._runtime.calls import run_hooks
from hostcall._core.context import why_waiting_is_forbidden

logger = logging.getLogger("hostcall")

_hooks: list[Callable[[], None]] = []
_local = threading.local()


def add_barrier_hook(hook: Callable[[], None]) -> None:
  """Runs ``hook()`` at the end of every barrier: where applications built
  on taps flush what they buffered."""
  _hooks.append(hook)


def barrier_started() -> float | None:
  """When the barrier running its hooks in this thread began
  (``time.monotonic()``), or None outside a barrier."""
  return getattr(_local, "started", None)


def wait_without_raising() -> None:
  """Waits until every callback started so far has run on the host and runs
  the barrier hooks (rows flushed, orphaned bars closed); raises nothing."""
  _local.started = time.monotonic()
  try:
    _deliver_everything()
    run_hooks(_hooks)
  finally:
    _local.started = None


def _after_jax_effects_barrier() -> None:
  """``jax.effects_barrier()`` waits for the host calls hostcall took out
  of JAX's effects as for JAX's own: until they have run (raising
  nothing, as JAX's barrier raises nothing of its callbacks'; the barrier
  hooks, such as the metrics writers' flush, are ``hostcall.barrier()``'s),
  except where it would wait for itself (called from a host function).
  With nothing on its way to the host it returns at once: JAX's own
  barrier costs a few microseconds, and code calls it in loops."""
  if why_waiting_is_forbidden() is None and tap_queue.anything_to_wait_for():
    _deliver_everything()


def _deliver_everything() -> None:
  """Waits for every call started so far to have run on the host; the
  next dispatch then notes ``sys.stdout`` afresh."""
  tap_queue.wait()
  dispatch_stdout.forget()


_jax_private.on_effects_barrier(_after_jax_effects_barrier)


def barrier(logging_name: str | None = None) -> None:
  """Waits until every callback started before it has run on the host.

  Raises ``CallbackException`` if a tap function (``id_tap``, ``id_print``)
  raised since the last barrier, or the host function of a result-less call
  delivered asynchronously (``debug_callback``, ``debug_print``,
  ``io_callback`` without results, under ``hostcall.delivery("async")``),
  with the last exception's text and traceback. Synchronous calls of JAX's
  callbacks fail their JAX call instead, as in JAX.

  Called from a signal handler that interrupted a host function (say, a
  ``SIGTERM`` handler's ``hostcall.barrier(); sys.exit()`` during a
  synchronous tap), it delivers the asynchronous taps already queued and
  returns: the computation running that host function cannot end before
  it, and failures wait for the next barrier.

  Arguments:
    logging_name: a name for this barrier in hostcall's debug log.

  Example:
    >>> import jax, hostcall
    >>> seen = []
    >>> _ = jax.jit(lambda x: hostcall.host_callback.id_tap(
    ...     lambda v, tr: seen.append(int(v)), x))(3)
    >>> hostcall.barrier()
    >>> seen
    [3]
  """
  inside = why_waiting_is_forbidden()
  if inside is not None and _in_a_signal_handler(sys._getframe(1)):
    # A signal handler (SIGTERM's `barrier(); sys.exit()`) that interrupted
    # a host function of the main thread: the computation waits for that
    # function, so waiting for the computation would wait for itself. What
    # can be had is what an exit would lose: the taps already queued.
    logger.debug("barrier %s: in a signal handler inside a host function: "
                 "delivering what is queued", logging_name or "")
    tap_queue.consumer.drain()
    return
  if inside is not None:
    raise RuntimeError(
        f"hostcall.barrier() / barrier_wait() was called from inside {inside}"
        ", where it would wait for the very computation (or queue, or "
        "thread) that is running it. Call it from the code that runs the JAX "
        "program, after the call returns.")
  logger.debug("barrier %s: waiting", logging_name or "")
  wait_without_raising()
  logger.debug("barrier %s: done", logging_name or "")
  errors.raise_postponed()


def _in_a_signal_handler(frame) -> bool:
  """Whether ``frame`` is (called by) a Python signal handler that runs
  inside a host function: the handlers run in the main thread, between two
  bytecodes of whatever it runs, a host function included."""
  if threading.current_thread() is not threading.main_thread():
    return False
  handlers = set()
  for signum in signal.valid_signals():
    try:
      handler = signal.getsignal(signum)
    except (OSError, ValueError):
      continue
    code = getattr(getattr(handler, "__func__", handler), "__code__", None)
    if code is not None:
      handlers.add(code)
  while frame is not None and not calls.is_host_function_entry(frame):
    if frame.f_code in handlers:
      return True
    frame = frame.f_back
  return False
