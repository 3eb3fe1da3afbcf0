"""Waiting for everything sent to the host, and what applications do then.

``settle()`` waits until every call started so far has run on the host
(running computations, then the asynchronous queue, transitively) and runs
the barrier hooks (applications flush rows, close orphaned bars);
``barrier()`` does the same and raises what taps raised since the last one.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from hostcall._async import queue
from hostcall._core import errors
from hostcall._core.calls import run_hooks
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


def settle() -> None:
  """Waits until every callback started so far has run on the host and runs
  the barrier hooks (rows flushed, orphaned bars closed); raises nothing."""
  _local.started = time.monotonic()
  try:
    queue.wait()
    run_hooks(_hooks)
  finally:
    _local.started = None


def barrier(logging_name: str | None = None) -> None:
  """Waits until every callback started before it has run on the host.

  Raises ``CallbackException`` if a tap function raised since the last
  barrier, with the last exception's text and traceback.

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
  if inside is not None:
    raise RuntimeError(
        f"hostcall.barrier() / barrier_wait() was called from inside {inside}"
        ", where it would wait for the very computation (or queue, or "
        "thread) that is running it. Call it from the code that runs the JAX "
        "program, after the call returns.")
  logger.debug("barrier %s: waiting", logging_name or "")
  settle()
  logger.debug("barrier %s: done", logging_name or "")
  errors.raise_postponed()
