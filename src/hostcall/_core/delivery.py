"""Which delivery a tap gets when its program is traced: ``"sync"`` (the
host function runs inside the computation) or ``"async"`` (queued)."""

from __future__ import annotations

import contextlib
import threading

DELIVERIES = ("sync", "async")

_default = "sync"
_local = threading.local()


def check(mode: str) -> str:
  if mode not in DELIVERIES:
    raise ValueError(f"delivery must be one of {DELIVERIES}, got {mode!r}.")
  return mode


def current() -> str:
  """The delivery in force: the innermost ``delivery(...)`` block, else the
  default set by ``set_delivery``."""
  return getattr(_local, "mode", None) or _default


def set_delivery(mode: str) -> None:
  """Sets the default delivery of taps traced from now on.

  Arguments:
    mode: ``"sync"`` (the default: the host function runs inside the
      computation, which waits for it; ``jax.effects_barrier()`` sees it
      done) or ``"async"`` (the tap's values are queued and a host thread
      runs the host function; the computation never waits for Python and
      keeps asynchronous dispatch; ``hostcall.barrier()`` waits for it).
  """
  global _default
  _default = check(mode)


@contextlib.contextmanager
def delivery(mode: str):
  """Taps traced inside the block get ``mode`` (see ``set_delivery``).

  The mode is fixed when a function is traced: a jitted function keeps the
  delivery of its first trace. Also a decorator, for the function you jit.

  Arguments:
    mode: ``"sync"`` or ``"async"``.

  Example:
    >>> import jax, hostcall
    >>> from hostcall import host_callback as hcb
    >>> with hostcall.delivery("async"):
    ...   f = jax.jit(lambda x: hcb.id_print(x, what="async"))
    ...   _ = f(1.0)
    >>> hostcall.barrier()
    what: async
    1.
  """
  previous = getattr(_local, "mode", None)
  _local.mode = check(mode)
  try:
    yield
  finally:
    _local.mode = previous
