"""Partitioned calls: one host call per shard, no all-gather.

Under ``jit`` of arrays sharded over several devices (a global view), a
host call normally receives the whole value, gathered to one device. With
``partitioned=True`` (JAX's ``debug.callback`` option, which hostcall also
offers to taps and result-less io callbacks) every device calls the host
with its own shard, as XLA placed it: nothing is gathered.

JAX's runtime hands each call its local shards but not where they sit in
the global array, nor which device made the call. hostcall adds, for every
array operand and each of its dimensions, an ``int32`` iota kept in the same
sharding group as the operand (so XLA shards it alike): the first element of
each local (1-based) iota is one past the shard's offset along that
dimension, and 0 in a shard of XLA's padding. A last operand,
an iota over the devices split one element per device, tells the device.
The host trims XLA's padding of uneven shards and skips a device whose
shard holds no element of the array; ``call_context().shard_indices`` gives
each operand's index (a tuple of slices) in its global array.

Cost: per operand, ``ndim`` int32 arrays the size of its local shard. The
runtime cannot thread an ordering token through a partitioned call: such
calls are unordered (JAX's debug callbacks refuse ``ordered=True`` on
several devices altogether).
"""

from __future__ import annotations

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo

from hostcall import _jax_private
from hostcall._core.context import make_context

_INDEX = np.int32


def _iota(ctx, shape, dimension: int, widened: bool = False):
  """A 1-based iota along ``dimension``: 0 never names an element, so that
  a shard of XLA's padding (zeros) is told from element 0. ``widened``: cut
  from an iota twice as long along ``dimension``."""
  aval = _jax_private.ShapedArray(shape, _INDEX)
  wide = tuple(2 * n if d == dimension and widened else n
               for d, n in enumerate(shape))
  (wide_type,) = _jax_private.aval_to_ir_types(
      ctx.module_context, _jax_private.ShapedArray(wide, _INDEX))
  iota = hlo.iota(wide_type, ir.IntegerAttr.get(
      ir.IntegerType.get_signless(64), dimension))
  if widened:
    iota = hlo.slice(iota, ir.DenseI64ArrayAttr.get([0] * len(shape)),
                     ir.DenseI64ArrayAttr.get(list(shape)),
                     ir.DenseI64ArrayAttr.get([1] * len(shape)))
  (result_type,) = _jax_private.aval_to_ir_types(ctx.module_context, aval)
  one = hlo.broadcast_in_dim(result_type, _jax_private.ir_constant(_INDEX(1)),
                             ir.DenseI64ArrayAttr.get([]))
  return hlo.add(iota, one), aval


def _index_iotas(shape) -> list[tuple[int, bool]]:
  """``(dimension, widened)`` of each index iota of an operand of
  ``shape``. XLA folds an iota along a dimension of size 1 into a constant
  that padding shards share, in some layouts; the widened iota escapes that
  in others: such a dimension gets both, and a shard is padding if either
  says so."""
  return [(d, widened) for d, n in enumerate(shape)
          for widened in ((False, True) if n == 1 else (False,))]


def operands(ctx, args, avals, num_devices: int):
  """The call's operands: the arrays, their index iotas, the device probe."""
  values, value_avals = list(args), list(avals)
  for x, aval in zip(args, avals):
    for d, widened in _index_iotas(aval.shape):
      iota, iota_aval = _iota(ctx, aval.shape, d, widened)
      values.append(_jax_private.shard_alike(ctx, x, iota, aval, iota_aval))
      value_avals.append(iota_aval)
  probe, probe_aval = _iota(ctx, (num_devices,), 0)
  values.append(_jax_private.split_over_devices(ctx, probe, probe_aval,
                                                num_devices))
  value_avals.append(probe_aval)
  return values, value_avals


def _offset(iota, size: int) -> int:
  """Where a shard starts along a dimension, from its 1-based iota: 0 is
  XLA's padding, as is a value past the end (padding continued from the
  last element); either gives ``size`` (no element)."""
  first = int(np.asarray(iota).reshape(-1)[0]) if iota.size else 1
  return first - 1 if 0 < first <= size else size


def unpack(flat, global_avals, devices, transforms):
  """``(arrays, context)`` for one partitioned call, or None for a device
  whose shard holds no element of some array (XLA's padding)."""
  n = len(global_avals)
  arrays, rest = list(flat[:n]), list(flat[n:])
  position = int(np.asarray(rest.pop()).reshape(-1)[0]) - 1
  indices = []
  for i, aval in enumerate(global_avals):
    kinds = _index_iotas(aval.shape)
    iotas, rest = rest[:len(kinds)], rest[len(kinds):]
    offsets = [0] * aval.ndim
    for (d, _), iota in zip(kinds, iotas):
      offsets[d] = max(offsets[d], _offset(iota, aval.shape[d]))
    local = arrays[i]
    index = []
    for d, (offset, size) in enumerate(zip(offsets, aval.shape)):
      valid = max(0, min(local.shape[d], size - offset))
      index.append(slice(offset, offset + valid))
    index = tuple(index)
    trimmed = local[tuple(slice(0, s.stop - s.start) for s in index)]
    if trimmed.size == 0 and int(np.prod(aval.shape)) != 0:
      return None
    arrays[i] = trimmed
    indices.append(index)
  context = make_context(transforms, devices[position],
                         shard_indices=tuple(indices))
  return arrays, context
