"""Collecting the taps of a loop body instead of staging them.

``hostcall.scan`` traces its body with a ``Collector`` active
(``collecting()``). A result-less call bound directly in that body (not
inside a ``cond``, ``while`` or ``vmap`` of the body) is not staged as a
host call: ``bind`` hands it to ``intercept``, which records its target and
operands, and the loop makes them extra outputs, delivered K steps at a
time (see ``hostcall._apps.scan``).
"""

from __future__ import annotations

import contextlib
import threading

import jax
import jax.numpy as jnp

from hostcall import _jax_private
from hostcall._core.targets import HostTarget

_local = threading.local()


class Collector:
  """The taps bound at the top level of one trace of a loop body: each
  ``(target, values, delivery)``, and the ordering each was bound with."""

  def __init__(self, trace):
    self.trace = trace
    self.taps: list[tuple[HostTarget, list, str]] = []
    self.orderings: list[str] = []

  def owns(self, flat_args) -> bool:
    """Whether a call on ``flat_args`` is bound by the body's own trace
    (not inside a cond, while or vmap in the body, even one that closes over
    body values), on the body's values or constants."""
    with _jax_private.take_current_trace() as current:
      if current is not self.trace:
        return False
    return all(_jax_private.trace_of(a) in (self.trace, None)
               for a in flat_args)

  def signature(self) -> list:
    """``(target, operand specs, delivery)`` of each collected tap."""
    return [(target, [jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v))
                      for v in values], delivery)
            for target, values, delivery in self.taps]


def intercept(flat_args, target: HostTarget, delivery: str,
              ordering: str) -> bool:
  """Records a result-less call (delivered as ``delivery`` asks, bound with
  ``ordering``) in the active collector; True if recorded."""
  collector = getattr(_local, "collector", None)
  if (collector is None or not target.bufferable
      or not collector.owns(flat_args)):
    return False
  collector.taps.append((target, list(flat_args), delivery))
  collector.orderings.append(ordering)
  return True


@contextlib.contextmanager
def collecting(active: bool = True):
  """``with collecting() as collector:`` the taps bound at the top level of
  the current trace are recorded in ``collector`` instead of staged; with
  ``active=False`` none is (the collector stays empty), not even by an
  enclosing loop's collector."""
  with _jax_private.take_current_trace() as trace:
    collector = Collector(trace)
  previous = getattr(_local, "collector", None)
  _local.collector = collector if active else None
  try:
    yield collector
  finally:
    _local.collector = previous
