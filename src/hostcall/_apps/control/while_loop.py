"""``hostcall.control.while_loop``: a steered loop that no bar draws (a
chunked loop, ``loops/chunked.py``, whose site's spec is
``invocations.NoBarSpec``)."""

from __future__ import annotations

from typing import Any, Callable

from hostcall._apps.loops import (chunked as _chunked, chunks as _chunks,
                                  invocations as _loops)
from hostcall._apps.control.spec import Stop
from hostcall._core.checks import check_callable


def while_loop(cond_fun: Callable, body_fun: Callable, init_val, *,
               every: int | None = None, interruptible: bool = False,
               time_limit: float | None = None,
               stop_when: Callable | None = None) -> Any:
  """``jax.lax.while_loop`` that the host can stop, without a progress bar.

  Arguments:
    cond_fun, body_fun, init_val: as for ``jax.lax.while_loop``.
    every: steps between two checks; default None lets the host pace them
      (about ten a second, whatever a step costs).
    interruptible: the first Ctrl-C (a notebook's interrupt) stops the loop
      at its next check and the call returns normally; a second one raises
      ``KeyboardInterrupt`` as usual.
    time_limit: seconds after which the loop stops at its next check.
    stop_when: a host predicate of a ``LoopStatus``, called after each
      chunk; True stops the loop at a following check.

  Returns:
    A ``hostcall.control.Result``: the carry when the loop ended or
    stopped, whether it stopped early, after how many steps, and why.

  Example:
    >>> import jax, hostcall
    >>> out = jax.jit(lambda: hostcall.control.while_loop(
    ...     lambda c: c < 10**9, lambda c: c + 1, 0, every=1000,
    ...     stop_when=lambda status: status.steps >= 5000))()
    >>> bool(out.stopped), hostcall.control.reason_name(out.reason)
    (True, 'stop_when')
    >>> int(out.steps) == int(out.value) and 5000 <= int(out.steps) <= 7000
    True
  """
  if interruptible is False and time_limit is None and stop_when is None:
    raise TypeError("hostcall.control.while_loop needs a reason to stop: "
                    "interruptible=True, time_limit= or stop_when=; without "
                    "one, use jax.lax.while_loop.")
  check_callable(cond_fun, "the while loop's cond_fun")
  check_callable(body_fun, "the while loop's body_fun")
  if every is not None:
    _chunks.check_every(every, ", or None for the default")
  stop = Stop.of(interruptible, time_limit, stop_when)
  # No bar: its site's spec is NoBarSpec, which no drawing listener draws;
  # it ticks only for its predicate.
  site = _loops.invocations.site(_loops.NoBarSpec(_chunked.depth(),
                                                stop.interruptible))
  return _chunked.while_loop(site, stop, stop.stop_when is not None,
                             cond_fun, body_fun, init_val, -1, every)
