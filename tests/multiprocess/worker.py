"""One process of the multi-process test: 2 local CPU devices each.

Usage: worker.py PORT NUM_PROCESSES PROCESS_ID OUT_DIR [INIT_TIMEOUT_S]
Writes OUT_DIR/taps-<process>.jsonl: one line per host call this process's
host functions received (the per-process file pattern of docs/distributed.md),
OUT_DIR/bar-<process>.txt (a progress bar's stream) and OUT_DIR/run-<process>/
(metrics: "run", written by each process to run/process_<k>/; "gathered",
written by process 0 alone, every process's rows, through jsonl, csv and,
where MLflow is installed, OUT_DIR/mlflow.db; "zero", process 0's rows
alone).
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

port, num_processes, process_id, out_dir = sys.argv[1:5]
init_timeout = int(sys.argv[5]) if len(sys.argv) > 5 else 120
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                           num_processes=int(num_processes),
                           process_id=int(process_id),
                           initialization_timeout=init_timeout)

import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import hostcall  # noqa: E402
from hostcall import host_callback as hcb  # noqa: E402

out = open(os.path.join(out_dir, f"taps-{jax.process_index()}.jsonl"), "w")


def record(kind, returns=True):
  def host(value):
    ctx = hostcall.call_context()
    out.write(json.dumps({"kind": kind, "process": jax.process_index(),
                          "device": jax.devices().index(ctx.device),
                          "device_process": ctx.process_index,
                          "value": np.asarray(value).tolist()}) + "\n")
    out.flush()
    return value if returns else None
  return host


mesh = Mesh(np.array(jax.devices()), ("i",))
sharded = NamedSharding(mesh, P("i"))
x = jax.make_array_from_callback(
    (8,), sharded, lambda index: np.arange(8.0, dtype=np.float32)[index])

# Per device: every device taps its own block, in shard_map.
per_device = jax.jit(jax.shard_map(
    lambda v: hcb.id_tap(lambda a, t: record("tap")(a), v) * 2, mesh=mesh,
    in_specs=P("i"), out_specs=P("i")))
per_device(x).block_until_ready()

# Per device, asynchronous delivery.
per_device_async = jax.jit(jax.shard_map(
    lambda v: hcb.id_tap(lambda a, t: record("async")(a), v, delivery="async"),
    mesh=mesh, in_specs=P("i"), out_specs=P("i")))
per_device_async(x).block_until_ready()

# Per device with results returned to each device.
def plus_device(v):
  record("call")(v)
  return v + 100 * jax.devices().index(hostcall.call_context().device)

called = jax.jit(jax.shard_map(
    lambda v: hostcall.pure_callback(plus_device, jax.ShapeDtypeStruct(
        v.shape, v.dtype), v), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
result = called(x)
for shard in result.addressable_shards:
  expected = np.arange(8.0)[shard.index] + 100 * jax.devices().index(
      shard.device)
  assert np.array_equal(np.asarray(shard.data), expected), (shard, expected)

# Global view: gathered, one call, on the first device of the computation.
jax.jit(lambda v: hostcall.io_callback(record("global", returns=False),
                                       None, v))(x)

# A progress bar (drawn by process 0 only) and metrics: every process its
# own rows, process 0 every process's rows, process 0 its own rows.
bar = open(os.path.join(out_dir, f"bar-{jax.process_index()}.txt"), "w")
run = hostcall.metrics.Run("run", root=out_dir)
gathered_writers = ["jsonl", "csv"]
try:
  import mlflow  # noqa: F401
except ImportError:
  pass
else:
  os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{out_dir}/mlflow.db"
  gathered_writers.append("mlflow")
gathered = hostcall.metrics.Run("gathered", root=out_dir,
                                writers=gathered_writers,
                                params={"devices": 4}, processes="gather")
zero = hostcall.metrics.Run("zero", root=out_dir, processes="zero")
with open(os.path.join(out_dir, f"writers-{jax.process_index()}.json"),
          "w") as f:
  json.dump([type(w).__name__ for w in gathered.writers], f)


def looped(v):
  def step(c, i):
    for each in (run, gathered, zero):
      each.log(i, value=c[0])
    return c + 1.0, None
  return hostcall.progress.scan(step, v, np.arange(12), file=bar,
                                desc="loop")[0]


jax.jit(jax.shard_map(looped, mesh=mesh, in_specs=P("i"),
                      out_specs=P("i")))(x)

# Steered loops: a host asks to stop, the devices of every process stop
# after the same check. In shard_map (whose body communicates), only
# process 1's predicate asks; in a global view, only process 0's is asked.
me = jax.process_index()


def steered(v, asks):
  def step(c, _):
    return c + jax.lax.psum(v, "i") if asks == "shard_map" else c + v, None
  out = hostcall.progress.scan(
      step, v * 0, length=100_000, every=100, disable=True,
      stop_when=lambda status: me == (1 if asks == "shard_map" else 0)
      and status.steps >= 300)
  return out.value[0], jax.numpy.broadcast_to(out.steps, v.shape)


steer = {}
for asks, program in [
    ("shard_map", jax.jit(jax.shard_map(lambda v: steered(v, "shard_map"),
                                        mesh=mesh, in_specs=P("i"),
                                        out_specs=P("i")))),
    ("global", jax.jit(lambda v: steered(v, "global")))]:
  carry, steps = program(x)
  steer[asks] = {
      "steps": sorted({int(np.asarray(s.data).reshape(-1)[0])
                       for s in steps.addressable_shards}),
      "carry": [np.asarray(s.data).tolist()
                for s in carry.addressable_shards]}
with open(os.path.join(out_dir, f"steer-{me}.json"), "w") as f:
  json.dump(steer, f)

hostcall.barrier()
for each in (run, zero, gathered):  # gathered: process 0 waits for process 1
  each.close()
run.close()
bar.close()
out.close()
print(f"process {jax.process_index()} done", flush=True)
jax.distributed.shutdown()
