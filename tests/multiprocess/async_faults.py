"""One process of the two-process fault test of asynchronous taps: 2 local
CPU devices each, a loop under shard_map over the 4 devices of both
processes whose body communicates (psum) and taps asynchronously.

Usage: async_faults.py PORT NUM_PROCESSES PROCESS_ID MODE OUT_DIR

MODE ``raise``: two runs; in the first the tap function of process 1's
first device raises at step 5, in the second process 0's. After each run
the process's barrier's outcome and the steps each local device's tap
function received are written, as one JSON line, to
OUT_DIR/faults-<process>.jsonl.
MODE ``kill``: process 1's tap function kills its process (SIGKILL) at
step 300 of a long loop (a 64 KiB queue keeps the devices near their
tap functions: the loop cannot end first); process 0 taps on, each tap
written at once to OUT_DIR/taps-<process>.txt, until JAX's distributed
service ends it.
The device reaches the native queue by the route HOSTCALL_NATIVE asks for
(its FFI handler, or JAX's callbacks with 0).
"""

import json
import os
import signal
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

port, num_processes, process_id, mode, out_dir = sys.argv[1:6]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
# A short heartbeat: a killed peer is declared dead after 10 s, not 100.
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                           num_processes=int(num_processes),
                           process_id=int(process_id),
                           initialization_timeout=120,
                           heartbeat_timeout_seconds=10)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import hostcall  # noqa: E402
from hostcall import host_callback as hcb  # noqa: E402

me = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("i",))
STEPS, FAILING_STEP = (12, 5) if mode == "raise" else (100_000, 300)
failing = {"device": None}
seen: dict = {}
log = open(os.path.join(out_dir, f"taps-{me}.txt"), "w")


def host(value, transforms):
  step, block = value
  # The device's place among all devices (ids are 0, 1, 2048, 2049).
  device = jax.devices().index(hostcall.call_context().device)
  seen.setdefault(device, []).append(int(step))
  if mode == "kill":
    log.write(f"{device} {int(step)} {float(block[0])}\n")
    log.flush()
  if device == failing["device"] and int(step) == FAILING_STEP:
    if mode == "kill":
      os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError(f"boom on device {device} in process {me}")


def loop(v):
  def step(c, s):
    # 4 KiB a tap: through a 64 KiB queue (kill), the devices run at most
    # a few steps ahead of the tap function.
    hcb.id_tap(host, (s, jnp.full(1024, v[0]) + s), delivery="async")
    # Each step waits for every device (the psum reads the carry: XLA
    # cannot hoist it out of the loop).
    return jax.lax.psum(c, "i") / 4 + v, None
  return jax.lax.scan(step, v * 0, jnp.arange(STEPS))[0]


f = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=P("i"),
                          out_specs=P("i")))
x = jax.make_array_from_callback(
    (4,), NamedSharding(mesh, P("i")),
    lambda index: np.arange(4.0, dtype=np.float32)[index])

if mode == "kill":
  hostcall.set_queue_capacity(64 << 10)
  failing["device"] = 2  # process 1's first device
  jax.block_until_ready(f(x))
  print(f"outcome {me} returned", flush=True)  # not expected
  os._exit(0)

with open(os.path.join(out_dir, f"faults-{me}.jsonl"), "w") as out:
  for failing_process in (1, 0):
    failing["device"] = 2 * failing_process  # its first device
    seen.clear()
    carry = jax.block_until_ready(f(x))
    try:
      hostcall.barrier()
      barrier = "nothing"
    except hcb.CallbackException as exc:
      barrier = str(exc).split("\n")[-4:]
    hostcall.barrier()  # reported once
    out.write(json.dumps({
        "failing_process": failing_process,
        "native": hostcall.queue_stats()["native"], "barrier": barrier,
        "seen": {str(d): steps for d, steps in sorted(seen.items())},
        "carry": np.asarray(carry.addressable_shards[0].data).tolist()})
        + "\n")
    out.flush()
print(f"process {me} done", flush=True)
os._exit(0)  # no shutdown handshake to wait for
