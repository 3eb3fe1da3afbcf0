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
each local iota is the shard's offset along that dimension. A last operand,
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

import jax
import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo
from jax.interpreters import mlir

from hostcall import _jax_private
from hostcall._core import host

_INDEX = np.int32


def _iota(ctx, shape, dimension: int):
  aval = jax.core.ShapedArray(shape, _INDEX)
  (result_type,) = mlir.aval_to_ir_types(ctx.module_context, aval)
  return hlo.iota(result_type, ir.IntegerAttr.get(
      ir.IntegerType.get_signless(64), dimension)), aval


def operands(ctx, args, avals, num_devices: int):
  """The call's operands: the arrays, their index iotas, the device probe."""
  values, value_avals = list(args), list(avals)
  for x, aval in zip(args, avals):
    for d in range(aval.ndim):
      iota, iota_aval = _iota(ctx, aval.shape, d)
      values.append(_jax_private.shard_alike(ctx, x, iota, aval, iota_aval))
      value_avals.append(iota_aval)
  probe, probe_aval = _iota(ctx, (num_devices,), 0)
  values.append(_jax_private.split_over_devices(ctx, probe, probe_aval,
                                                num_devices))
  value_avals.append(probe_aval)
  return values, value_avals


def unpack(flat, global_avals, devices, transforms):
  """``(arrays, context)`` for one partitioned call, or None for a device
  whose shard holds no element of some array (XLA's padding)."""
  n = len(global_avals)
  arrays, rest = list(flat[:n]), list(flat[n:])
  position = int(np.asarray(rest.pop()).reshape(-1)[0])
  indices = []
  for i, aval in enumerate(global_avals):
    iotas, rest = rest[:aval.ndim], rest[aval.ndim:]
    local = arrays[i]
    index = []
    for d, (iota, size) in enumerate(zip(iotas, aval.shape)):
      offset = int(np.asarray(iota).reshape(-1)[0]) if iota.size else 0
      valid = max(0, min(local.shape[d], size - offset))
      index.append(slice(offset, offset + valid))
    index = tuple(index)
    trimmed = local[tuple(slice(0, s.stop - s.start) for s in index)]
    if trimmed.size == 0 and int(np.prod(aval.shape)) != 0:
      return None
    arrays[i] = trimmed
    indices.append(index)
  context = host.make_context(transforms, devices[position],
                              shard_indices=tuple(indices))
  return arrays, context
