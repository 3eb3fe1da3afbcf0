"""The plan by which the host replays a program's deferred calls
(``hostcall.jit``'s outputs route): ``Call`` and ``Loop`` nodes in program
order, ``pack`` (the calls' values as one flat buffer of bytes, each in a
carrier dtype that converts back exactly) and ``Plan.replay``."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hostcall._core.context import make_context
from hostcall._core.targets import HostTarget, Steps
from hostcall._jit import packing


@dataclasses.dataclass(frozen=True)
class Call:
  """One deferred host call: its target, transformations and operands'
  shapes and dtypes (without the stacking of enclosing loops)."""

  target: HostTarget
  transforms: tuple
  shapes: tuple
  dtypes: tuple
  device_index: int = 0

  @property
  def size(self) -> int:
    return len(self.shapes)


@dataclasses.dataclass(frozen=True)
class Loop:
  """The deferred calls of a ``lax.scan`` body, stacked ``length`` deep."""

  length: int
  reverse: bool
  body: tuple

  @property
  def size(self) -> int:
    return sum(node.size for node in self.body)


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
  """How the host replays a program's deferred calls from its packed
  output: ``nodes`` in program order; ``slots`` say where each flat value
  sits (``(start, stop, carrier, shape, dtype)``: bytes of the output, read
  as ``carrier`` and converted to ``dtype``). Compared by identity: one per
  traced program."""

  nodes: tuple
  slots: tuple
  _contexts: dict = dataclasses.field(default_factory=dict, repr=False)

  @property
  def nbytes(self) -> int:
    """The size of one call's packed output."""
    return self.slots[-1][1] if self.slots else 0

  def replay(self, packed: Sequence[np.ndarray], devices, run) -> None:
    """Calls ``run(target, operands, context)`` for each deferred call of
    the calls of the program whose packed outputs are ``packed`` (one
    array of bytes per call), in the order the calls were made, each in
    program order. A program whose only deferred call is a vectorised
    target at its top level (``deliver_steps``: a metrics row) hands every
    call's values to it at once, as ``hostcall.scan`` delivers a chunk:
    nothing else runs between those calls, so that the rows keep their
    order (and a run logged without steps numbers them as ``jax.jit``'s
    calls would). ``devices``: the program's devices, a call's
    ``device_index`` picks its caller."""
    contexts = self._contexts.get(devices)
    if contexts is None:
      contexts = self._contexts[devices] = {}
    rows = np.stack(packed) if len(packed) > 1 else packed[0][None]
    rows = rows.view(np.uint8)  # (a pack is of words: read as bytes)
    # Each value of every call at once: (calls, *shape).
    columns = [_uncarried(rows[:, start:stop], carrier, shape, dtype)
               for start, stop, carrier, shape, dtype in self.slots]
    node = self.nodes[0] if len(self.nodes) == 1 else None
    if (len(packed) > 1 and type(node) is Call
        and node.target.deliver_steps is not None
        and node.target.joins_calls):
      context = _context_of(node, devices, contexts)
      rank = len(context.batch_levels)
      stacked = [np.moveaxis(c, 0, rank) if rank else c for c in columns]
      run(Steps(node.target, len(packed)), stacked, context)
      return
    for i in range(len(packed)):
      # (i, ...): a 0-d value stays an array, as the runtime hands it.
      _replay(self.nodes, [c[i, ...] for c in columns], devices, run,
              contexts)


def _uncarried(raw: np.ndarray, carrier, shape, dtype) -> np.ndarray:
  value = np.ascontiguousarray(raw).view(carrier).reshape(
      (raw.shape[0], *shape))
  if carrier == dtype:
    return value
  if jnp.issubdtype(dtype, jnp.complexfloating):
    return value.view(dtype).reshape(value.shape[:-1])
  return value.astype(dtype)


def _context_of(node: Call, devices, contexts: dict):
  context = contexts.get(id(node))
  if context is None:
    device = devices[node.device_index if len(devices) > 1 else 0]
    context = contexts[id(node)] = make_context(node.transforms, device)
  return context


def _replay(nodes, values, devices, run, contexts) -> None:
  at = 0
  for node in nodes:
    mine = values[at:at + node.size]
    at += node.size
    if type(node) is Call:
      run(node.target, mine, _context_of(node, devices, contexts))
    else:
      steps = range(node.length)
      for step in (reversed(steps) if node.reverse else steps):
        _replay(node.body, [v[step, ...] for v in mine], devices, run,
                contexts)


def pack(values: Sequence, nodes: tuple) -> tuple[list, Plan]:
  """Packs the deferred ``values`` into one flat array of words (the host
  fetches one buffer per call, and reads it as bytes); returns
  ``([pack], plan)``."""
  if not values:
    return [jnp.zeros((0,), jnp.uint8)], Plan(nodes, ())
  carried = []
  for value in values:
    dtype = np.dtype(value.dtype)
    carrier, value = _carried(value, dtype)
    carried.append((carrier, _replicated(value), dtype))
  word = packing.word_of(carrier for carrier, _, _ in carried)
  itemsize = np.dtype(word).itemsize
  pieces, slots, used = [], [], 0
  for carrier, value, dtype in carried:
    words = packing.as_words(value, word)
    size = int(words.shape[0]) * itemsize
    slots.append((used, used + size, carrier, tuple(value.shape), dtype))
    used += size
    pieces.append(words)
  return [packing.concatenated(pieces)], Plan(nodes, tuple(slots))


def _replicated(value):
  """``value``, replicated where it is sharded over an explicit mesh axis
  (its type then says so, and flattening it would be refused: the host
  reads it whole anyway)."""
  sharding = getattr(jax.typeof(value), "sharding", None)
  spec = getattr(sharding, "spec", None)
  if spec is None or all(part is None for part in spec):
    return value
  return jax.sharding.reshard(value, jax.sharding.NamedSharding(
      sharding.mesh, jax.sharding.PartitionSpec()))


def _carried(value, dtype: np.dtype):
  """``(carrier dtype, value as the carrier)``: a dtype of whole bytes
  that ``bitcast_convert_type`` takes, and that converts back exactly."""
  if dtype == np.bool_:
    return np.dtype(np.uint8), value.astype(jnp.uint8)
  if jnp.issubdtype(dtype, jnp.complexfloating):
    parts = np.dtype(np.float64 if dtype.itemsize == 16 else np.float32)
    return parts, jnp.stack([jnp.real(value), jnp.imag(value)], axis=-1)
  floating = jnp.issubdtype(dtype, jnp.floating)
  bits = (jax.dtypes.finfo(dtype) if floating else jax.dtypes.iinfo(dtype)).bits
  if bits >= 8:
    return dtype, value
  # Less than a byte (int4, float4): widened exactly.
  if floating:
    wide = np.dtype(np.float32)
  elif jnp.issubdtype(dtype, jnp.signedinteger):
    wide = np.dtype(np.int8)
  else:
    wide = np.dtype(np.uint8)
  return wide, value.astype(wide)
