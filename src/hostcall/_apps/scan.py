"""``hostcall.scan``: ``lax.scan`` whose taps reach the host K steps at
a time (the buffering: ``loops/buffering.py``), a chunked loop
(``loops/chunks.py``) without a bar or a stop check."""

from __future__ import annotations

from typing import Any, Callable

from hostcall._apps.loops.chunks import chunked_scan


def scan(f: Callable, init, xs=None, length: int | None = None,
         reverse: bool = False, unroll: int | bool = 1, *,
         every: int = 64) -> Any:
  """``lax.scan`` whose taps reach the host ``every`` steps at a time.

  Arguments:
    f, init, xs, length, reverse, unroll: as for ``jax.lax.scan``.
    every: how many steps of taps the device gathers before one host call.
      The device holds ``every`` times one step's tap payload.

  Returns:
    What ``jax.lax.scan`` returns.

  Taps bound directly in ``f`` (``id_tap``, ``id_print``, result-less
  ``io_callback``/``debug_callback``, ``Run.log``) are buffered, where
  nothing else in ``f`` calls the host with an effect: a body that also
  makes a call with results, a call under control flow inside ``f``, or
  JAX's own callbacks, runs every call where it is written, so that the
  host sees ``lax.scan``'s order and a failure stops the loop at its step.
  Every buffered tap is still delivered once per step, in program order,
  before the loop's computation ends (or, with asynchronous delivery,
  through the queue).

  Example:
    >>> import jax, hostcall
    >>> from hostcall import host_callback as hcb
    >>> def step(c, _):
    ...   hcb.id_print(c, what="c")
    ...   return c + 1, None
    >>> _ = jax.jit(lambda: hostcall.scan(step, 0, length=2, every=8))()
    what: c
    0
    what: c
    1
  """
  return chunked_scan(f, init, xs, length, reverse, unroll, every=every)
