"""How a host call is emitted: the one place that decides.

Every call hostcall compiles (a synchronous call, a queued tap, a steered
loop's stop check) is emitted either as an XLA FFI custom call into
hostcall's native library (``"ffi"``: no Python, no GIL on the device's
side) or as JAX's runtime Python callback (``"python"``). ``route`` decides,
from the call's *handler* and the compilation's platform, the native
library's presence and whether the program is a global view:

=============  =====================  ==============  ===========  ========
handler        platform               native library  global view  emitted
=============  =====================  ==============  ===========  ========
``"call"``     any                    any             any          python
``"enqueue"``  a row of ``NATIVE``    loaded          no           ffi
``"check"``    a row of ``NATIVE``    loaded          no           ffi
any            otherwise                                           python
=============  =====================  ==============  ===========  ========

A global view (``jit`` over several devices) gets Python callbacks: the
SPMD partitioner drops a custom call's sharding, and one chosen device must
make the call. A new platform whose native handlers exist adds one row to
``NATIVE``; nothing else changes.
"""

from __future__ import annotations

import numpy as np
from jax.extend.mlir.dialects import stablehlo as hlo

from hostcall import _jax_private

#: The handlers hostcall's native libraries serve, per platform: ``enqueue``
#: (the queue's ``hostcall_enqueue``: a queued tap's operands copied into
#: the queue) and ``check`` (the stop check's ``hostcall_control_check``).
#: Each library (``libraries.Library``) registers its handlers for the
#: platforms this table gives them.
NATIVE: dict[str, frozenset] = {
    "cpu": frozenset({"enqueue", "check"}),
}


def global_view(axis_context) -> bool:
  """Whether the computation is ``jit`` over several devices (one program
  sees the global arrays)."""
  return (isinstance(axis_context, _jax_private.ShardingContext)
          and axis_context.num_devices > 1)


def route(ctx, handler: str, native_loaded: bool) -> str:
  """``"ffi"`` or ``"python"``: how the call ``handler`` (``"call"``,
  ``"enqueue"``, ``"check"``) is emitted in the lowering context ``ctx``
  (see the module's table)."""
  platforms = list(ctx.module_context.platforms)
  if (len(platforms) == 1 and handler in NATIVE.get(platforms[0], ())
      and native_loaded
      and not global_view(ctx.module_context.axis_context)):
    return "ffi"
  return "python"


def mesh_indices(ctx) -> list[dict]:
  """Under ``shard_map``, each calling device's index along the mesh's
  mapped axes, in the order ``caller`` gives the devices."""
  axis_context = ctx.module_context.axis_context
  mesh = getattr(axis_context, "mesh", None)
  if mesh is None:
    return []
  names = list(mesh.axis_names)
  manual = getattr(axis_context, "manual_axes", None)
  mapped = [i for i, n in enumerate(names) if not manual or n in manual]
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
