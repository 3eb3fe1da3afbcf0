"""How a host call is emitted: the one place that decides.

Every call hostcall compiles (a synchronous call, a queued tap, a steered
loop's stop check) is emitted either as an XLA FFI custom call into
hostcall's native library (``"ffi"``: no Python, no GIL on the device's
side) or as JAX's runtime Python callback (``"python"``). ``route`` decides,
from the call's *handler* and the compilation's platform, whether the
native library's FFI handlers are registered (not with ``HOSTCALL_NATIVE=0``)
and whether the program is a global view:

=============  ========================  ============  ===========  ======
handler        platform                  FFI handlers  global view  emitted
=============  ========================  ============  ===========  ======
``"call"``     any                       any           any          python
``"enqueue"``  its row serves it         registered    no           ffi
``"check"``    its row serves it         registered    no           ffi
any            otherwise                                            python
=============  ========================  ============  ===========  ======

Either way a queued tap reaches the one native queue and a check the one
set of native stop states: a Python callback pushes into the queue and
polls the states through ctypes. There is no second, Python queue.

A global view (``jit`` over several devices) gets Python callbacks: the
SPMD partitioner drops a custom call's sharding, and one chosen device must
make the call.

Everything hostcall knows of a platform is its row of ``PLATFORMS``: the
native handlers served there (which ``libraries`` registers, which
``route`` emits, and whether ``hostcall.jit`` queues from the device there)
and whether its device buffers are host memory (where ``hostcall.jit``'s
outputs route starts no copy ahead). A new platform whose native handlers
exist adds one row; nothing else changes. A platform without a row gets
Python callbacks and outputs, as JAX's callbacks work everywhere.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from jax.extend.mlir.dialects import stablehlo as hlo

from hostcall import _jax_private


@dataclasses.dataclass(frozen=True)
class Platform:
  """A row of ``PLATFORMS``.

  Attributes:
    native: the native extension's handlers served there: ``"enqueue"``
      (the queue's ``hostcall_enqueue`` handlers: a queued tap's operands
      copied into the queue, ``hostcall.jit``'s queued calls) and
      ``"check"`` (the stop check's ``hostcall_control_check``, and a
      steered loop's end on its device, ``hostcall_control_finish``).
    host_buffers: whether its device buffers are host memory (a fetch to
      the host is a view).
  """

  native: frozenset = frozenset()
  host_buffers: bool = False


#: One row a platform hostcall has native handlers for, by JAX's platform
#: name; any other platform is ``Platform()``.
PLATFORMS: dict[str, Platform] = {
    "cpu": Platform(native=frozenset({"enqueue", "check"}), host_buffers=True),
}


def platform(name: str) -> Platform:
  """The row of platform ``name`` (an empty one where it has none)."""
  return PLATFORMS.get(name, Platform())


def serves(name: str, handler: str) -> bool:
  """Whether the native extension serves ``handler`` on platform ``name``."""
  return handler in platform(name).native


def global_view(axis_context) -> bool:
  """Whether the computation is ``jit`` over several devices (one program
  sees the global arrays)."""
  return (isinstance(axis_context, _jax_private.ShardingContext)
          and axis_context.num_devices > 1)


def one_device(axis_context) -> bool:
  """Whether the computation runs on one device: ``jit`` on one device, or
  ``shard_map`` over a mesh of one device (which JAX inlines, without a
  manual computation)."""
  if isinstance(axis_context, _jax_private.SPMDAxisContext):
    return math.prod(axis_context.mesh.shape.values()) == 1
  return (isinstance(axis_context, _jax_private.ShardingContext)
          and axis_context.num_devices == 1)


def op_sharding(axis_context, chosen, result_avals):
  """The sharding annotating a host call's op: JAX's choice for its own
  callbacks (``callback_op_sharding``: the chosen device under ``jit``,
  manual under ``shard_map``), but none on one device.

  On one device JAX's choice differs between ``jit`` (MAXIMAL on device 0)
  and an inlined ``shard_map`` (replicated, or MANUAL), where nothing is
  partitioned; and XLA's verifier refuses a conditional whose branches end
  in ops of different shardings ("Inconsistent conditional sharding among
  instructions"): a ``cond`` with a host call in a plain branch and another
  under ``shard_map``, each branch returning only the call's results or
  token (as partial evaluation leaves the known branches under ``grad``).
  An op without a sharding never conflicts, with hostcall's calls or with
  JAX's."""
  if one_device(axis_context):
    return None
  return _jax_private.callback_op_sharding(axis_context, chosen,
                                           result_avals)


def detached_token(token):
  """``token``, out of an op without a sharding (``after_all``, which only
  orders). The token of an ordered call annotated with a device would be
  the last op of a ``cond`` branch that returns only tokens, and branches
  calling from different devices then have inconsistent shardings, which
  XLA's verifier refuses (see ``op_sharding``)."""
  return hlo.after_all([token])


def route(ctx, handler: str, handlers_registered: bool) -> str:
  """``"ffi"`` or ``"python"``: how the call ``handler`` (``"call"``,
  ``"enqueue"``, ``"check"``) is emitted in the lowering context ``ctx``
  (see the module's table)."""
  platforms = list(ctx.module_context.platforms)
  if (len(platforms) == 1 and serves(platforms[0], handler)
      and handlers_registered
      and not global_view(ctx.module_context.axis_context)):
    return "ffi"
  return "python"


def mesh_indices(ctx) -> list[dict]:
  """Under ``shard_map``, each calling device's index along the mesh's
  mapped axes, in the order ``caller`` gives the devices. The axis of a
  ``pmap`` without ``axis_name`` is keyed ``None``, the name the user gave
  (JAX's own name for it is internal)."""
  axis_context = ctx.module_context.axis_context
  mesh = getattr(axis_context, "mesh", None)
  if mesh is None:
    return []
  names = [None if _jax_private.is_unnamed_pmap_axis(n) else n
           for n in mesh.axis_names]
  manual = getattr(axis_context, "manual_axes", None)
  mapped = [i for i, n in enumerate(mesh.axis_names)
            if not manual or n in manual]
  return [{names[i]: int(at[i]) for i in mapped}
          for at in np.ndindex(*mesh.devices.shape)]


def caller(ctx, device_index: int):
  """``(devices, partition)``: the calling device (one), or, under
  ``shard_map``, every device and the partition id that picks one."""
  axis_context = ctx.module_context.axis_context
  if isinstance(axis_context, _jax_private.SPMDAxisContext):
    devices = tuple(getattr(axis_context.mesh, "devices", np.array([])).flat)
    return devices, hlo.partition_id()
  assignment = getattr(axis_context, "device_assignment", None) or ()
  if not assignment:
    assignment = tuple(ctx.module_context.get_backend().local_devices())
  if len(assignment) > 1 and not 0 <= device_index < len(assignment):
    raise ValueError(
        f"device_index={device_index} is out of range: the computation runs "
        f"on {len(assignment)} devices; pass 0 <= device_index < "
        f"{len(assignment)}.")
  device = assignment[device_index] if len(assignment) > 1 else assignment[0]
  return device, None
