"""One process of a steered loop's fault test: 2 local CPU devices each.

Usage: steering_faults.py PORT NUM_PROCESSES PROCESS_ID FAULT LOOP

FAULT: ``raise`` (process 1's host function raises at step 300 on its
first device) or ``kill`` (process 1 kills itself with SIGKILL there).
LOOP: ``scan`` (progress.scan with a time limit) or ``while``
(control.while_loop, interruptible). The loop runs in shard_map over the
4 devices of both processes, its body communicating (psum).
Prints one line ``outcome <process> <what>`` and exits 0 unless killed.
"""

import os
import signal
import sys
import time

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

port, num_processes, process_id, fault, loop = sys.argv[1:6]
jax.config.update("jax_cpu_collectives_implementation", "gloo")
# A short heartbeat: a killed peer is declared dead after 10 s, not 100.
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                           num_processes=int(num_processes),
                           process_id=int(process_id),
                           initialization_timeout=120,
                           heartbeat_timeout_seconds=10)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import hostcall  # noqa: E402

FAILING_STEP, STEPS = 300, 100_000
me = jax.process_index()
mesh = Mesh(np.array(jax.devices()), ("i",))
failing_device = jax.devices()[2]  # process 1's first device


def host(step):
  if (hostcall.call_context().device == failing_device
      and int(step) == FAILING_STEP):
    if fault == "kill":
      os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError("boom in process 1")
  return np.int32(0)


def tap(step):
  return hostcall.pure_callback(host, jax.ShapeDtypeStruct((), jnp.int32),
                                step)


def steered(v):
  if loop == "scan":
    def step(c, i):
      return c + jax.lax.psum(v, "i") + tap(i), None
    return hostcall.progress.scan(step, v * 0, jnp.arange(STEPS), every=50,
                                  disable=True, time_limit=3600.0).value[0]
  out = hostcall.control.while_loop(
      lambda s: s[0] < STEPS,
      lambda s: (s[0] + 1, s[1] + jax.lax.psum(v, "i") + tap(s[0])),
      (0, v * 0), every=50, interruptible=True)
  return out.value[1]


f = jax.jit(jax.shard_map(steered, mesh=mesh, in_specs=P("i"),
                          out_specs=P("i")))
x = jax.make_array_from_callback(
    (4,), jax.sharding.NamedSharding(mesh, P("i")),
    lambda index: np.arange(4.0, dtype=np.float32)[index])
start = time.monotonic()
try:
  jax.block_until_ready(f(x))
  what = "returned"
except jax.errors.JaxRuntimeError as exc:
  text = str(exc)
  what = ("boom" if "boom in process 1" in text else
          "peer-failed" if "failed in another process" in text else
          "other: " + text[-300:].replace("\n", " "))
print(f"outcome {me} {what} {time.monotonic() - start:.1f}s", flush=True)
os._exit(0)  # the peer may be gone: no shutdown handshake to wait for
