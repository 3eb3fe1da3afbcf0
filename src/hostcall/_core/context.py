"""What a host function may learn about the call that reached it.

The primitive carries a call site's transformations as hashable tuples; a
``CallContext`` is built from them once per call site and device (per call
for a partitioned call, which also learns its shard's place), and is the
context of the host call while it runs in a thread (``call_context()``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any


@dataclasses.dataclass(frozen=True)
class CallContext:
  """What the host function may learn about the call that reached it.

  Attributes:
    transforms: the JAX transformations applied to the tapped value, outermost
      last, as ``(name, params)`` pairs, e.g.
      ``(('batch', {'batch_dims': (0,)}),)``.
    device: the ``jax.Device`` whose computation made the call.
    process_index: the index of the process that owns ``device``.
    batch_levels: ``(batch_dims, axis_size)`` of each enclosing ``vmap``,
      innermost first.
    shard_indices: in a partitioned call (``partitioned=True`` under ``jit``
      of sharded arrays), where each array operand's shard sits in its
      global array: one tuple of slices per flat operand. None otherwise.
    peers: the devices that each make this call site's call (``shard_map``,
      ``pmap``), ``device`` among them; empty where one device calls.
    axis_indices: under ``shard_map`` (and ``pmap``, which JAX runs as
      one), the calling device's index along each mapped axis of the mesh,
      by name (``{"x": 2}``): which block of the global array it holds
      (with ``in_specs=P("x")``, rows ``2 * n`` to ``3 * n`` of the global
      array) and which part of a ``pmap``'s batch. The axis of a ``pmap``
      without ``axis_name`` is keyed ``None`` (the name given):
      ``{None: 2}``. Empty elsewhere.
    gates: how many of the call's last flat operands say, per lane,
      whether the lane took a ``cond`` branch that holds the call (one per
      ``vmap`` of a ``cond`` whose predicate is batched; see ``gating``):
      the host calls only the lanes that took every one.
  """

  transforms: tuple[tuple[str, dict[str, Any]], ...]
  device: Any
  batch_levels: tuple[tuple[tuple, int], ...] = ()
  shard_indices: tuple[tuple[slice, ...], ...] | None = None
  peers: tuple = dataclasses.field(default=(), repr=False, compare=False)
  gates: int = 0
  axis_indices: dict = dataclasses.field(default_factory=dict)
  # hostcall's own: the count of its program's runs that may give the
  # hint of ``_runtime/dispatch_hint`` (a queued call's), None for most.
  _tally: Any = dataclasses.field(default=None, repr=False, compare=False)

  @property
  def process_index(self) -> int:
    """The index of the process (host) that owns ``device``."""
    return getattr(self.device, "process_index", 0)


#: A ``transforms`` entry of a call given one more operand, a lane's "took
#: this branch" flag (``gating``): ``CallContext.gates`` counts them.
GATE = ("gate",)

#: A ``transforms`` entry of a call whose last operand only orders it after
#: the calls before it (``hostcall.jit``'s queued calls; see ``deferring``):
#: its host side drops that operand.
AFTER = ("after",)


def batch_levels(transforms) -> tuple[tuple[tuple, int], ...]:
  """``(batch_dims, axis_size)`` of each vmap in ``transforms`` (the
  primitive's tuples, ``("batch", batch_dims, axis_size)``), innermost
  first."""
  return tuple((t[1], t[2]) for t in transforms if t[0] == "batch")


def _unpack_transforms(transforms: tuple) -> tuple:
  # The primitive keeps transforms as hashable tuples; users see dicts.
  unpacked = []
  for name, *params in transforms:
    if name in ("gate", "after"):
      continue  # said by CallContext.gates; dropped before the call
    if name == "batch":  # ("batch", batch_dims, axis_size)
      unpacked.append((name, {"batch_dims": params[0]}))
    else:
      unpacked.append((name, {}))
  return tuple(unpacked)


def make_context(transforms: tuple, device,
                 shard_indices: tuple | None = None,
                 peers: tuple = (), axis_indices: dict | None = None,
                 tally: Any = None) -> CallContext:
  """The context of one call site on one device."""
  return CallContext(_unpack_transforms(transforms), device,
                     batch_levels(transforms), shard_indices, tuple(peers),
                     transforms.count(GATE), dict(axis_indices or {}), tally)


_current = threading.local()


def call_context() -> CallContext | None:
  """The context of the host call running in this thread, or None.

  Host functions of every flavour may call it to learn which device called
  them (``.device``), from which process (``.process_index``) and under which
  transformations (``.transforms``, ``.batch_levels``). Under ``shard_map``
  and ``pmap``, ``.axis_indices`` gives the calling device's index along
  each mapped axis by its name (``{"x": 2}``); the axis of a ``pmap``
  without ``axis_name`` is keyed ``None`` (``{None: 2}``), not by JAX's
  internal name for it.

  Example:
    >>> import jax, numpy as np, hostcall
    >>> jax.jit(lambda x: hostcall.debug_callback(
    ...     lambda v: print(hostcall.call_context().device.id), x))(1.0)
    0
  """
  return getattr(_current, "context", None)


def delivering_asynchronously() -> bool:
  """Whether this thread delivers a queued (asynchronous) call now: its
  computation has gone on and will not fail with the host function."""
  return getattr(_current, "asynchronous", False)


def forbid_waiting(what: str) -> None:
  """Marks the calling thread, for good, as one that host calls wait for
  (``what``, e.g. ``"a metrics writer"``): a barrier there would wait for
  itself, and raises instead."""
  _current.waiting_forbidden = what


def why_waiting_is_forbidden() -> str | None:
  """What the calling thread is, if a barrier there would wait for itself
  (``"a host function"`` while it runs one), else None."""
  if getattr(_current, "context", None) is not None:
    return "a host function"
  return getattr(_current, "waiting_forbidden", None)


def swap_call_context(context: CallContext | None) -> CallContext | None:
  """Makes ``context`` this thread's call context; returns the one before.
  For hot loops that deliver many calls (restore the old one after)."""
  outer = getattr(_current, "context", None)
  _current.context = context
  return outer


class calling:  # noqa: N801 - used as a context manager, like open()
  """``with calling(context, asynchronous=...):`` the host function runs in
  ``context``; the one before is restored after (calls nest: a host
  function may run a computation that calls the host)."""

  __slots__ = ("_context", "_asynchronous", "_outer", "_since")

  def __init__(self, context: CallContext, asynchronous: bool = False):
    self._context, self._asynchronous = context, asynchronous

  def __enter__(self):
    self._outer = (getattr(_current, "context", None),
                   getattr(_current, "asynchronous", False),
                   getattr(_current, "call", None))
    self._since = time.monotonic()
    _current.context, _current.asynchronous, _current.call = (
        self._context, self._asynchronous, self)
    return self._context

  def __exit__(self, *exc) -> None:
    _current.context, _current.asynchronous, _current.call = self._outer


def enclosing_call_started() -> float | None:
  """When (``time.monotonic()``) the host call began inside which this
  thread runs the computation whose host function runs now: a host
  function that ran a computation (re-entrant), or a delivery thread's
  trip; None where the computation is not run from a host call. What this
  thread opened before then belongs to a computation still running below
  it."""
  call = getattr(_current, "call", None)
  outer = None if call is None else call._outer[2]
  return None if outer is None else outer._since
