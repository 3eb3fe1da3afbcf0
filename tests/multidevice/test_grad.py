"""grad_callback and Run.log_grad on 4 CPU devices: each device's backward
pass calls with its own cotangent, told which device it is."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcall

MESH = Mesh(np.array(jax.devices()), ("i",))
SHARDED = NamedSharding(MESH, P("i"))


def _x():
  return jax.device_put(jnp.arange(8.0), SHARDED)


def _recording(log):
  def host(ct, *args):
    log.append((hostcall.call_context().device.id, np.asarray(ct).tolist(),
                *[np.asarray(a).tolist() for a in args]))
  return host


def _loss(log, x, **options):
  # d/dh sum(h**2) = 2 h, h = 3 x: the cotangent of h is 6 x.
  h = hostcall.grad_callback(_recording(log), 3.0 * x, **options)
  return jnp.sum(h ** 2)


@pytest.mark.parametrize("delivery", ["sync", "async"])
def test_shard_map_calls_once_per_device_with_its_block(delivery):
  log = []

  def per_device(x):
    g = jax.grad(lambda x: _loss(log, x, delivery=delivery))(x)
    return g

  f = jax.jit(jax.shard_map(per_device, mesh=MESH, in_specs=P("i"),
                            out_specs=P("i")))
  out = f(_x())
  hostcall.barrier()
  np.testing.assert_array_equal(out, 18.0 * np.arange(8.0))
  assert sorted(log) == [(d, [12.0 * d, 12.0 * d + 6.0]) for d in range(4)]


def test_shard_map_scan_order_is_last_first_on_each_device():
  log = []

  def per_device(x):
    def step(c, i):
      return hostcall.grad_callback(_recording(log), c * 2.0, i), None
    return jax.grad(lambda x: jnp.sum(lax.scan(step, x, jnp.arange(3))[0]))(x)

  jax.jit(jax.shard_map(per_device, mesh=MESH, in_specs=P("i"),
                        out_specs=P("i")))(_x())
  hostcall.barrier()
  for d in range(4):
    mine = [(ct, i) for dev, ct, i in log if dev == d]
    assert mine == [([1.0, 1.0], 2), ([2.0, 2.0], 1), ([4.0, 4.0], 0)], mine


def test_pmap_calls_once_per_device_with_its_cotangent():
  log = []
  out = jax.pmap(jax.grad(lambda x: _loss(log, x)))(jnp.arange(4.0))
  hostcall.barrier()
  np.testing.assert_array_equal(out, 18.0 * np.arange(4.0))
  assert sorted(log) == [(d, 6.0 * d) for d in range(4)]


def test_global_view_is_one_call_with_the_gathered_cotangent():
  log = []
  out = jax.jit(jax.grad(lambda x: _loss(log, x)))(_x())
  hostcall.barrier()
  np.testing.assert_array_equal(out, 18.0 * np.arange(8.0))
  assert log == [(0, list(6.0 * np.arange(8.0)))]


def test_partitioned_calls_once_per_shard():
  log = []
  jax.jit(jax.grad(lambda x: _loss(log, x, partitioned=True)))(_x())
  hostcall.barrier()
  assert sorted(log) == [(d, [12.0 * d, 12.0 * d + 6.0]) for d in range(4)]


def test_log_grad_rows_carry_the_device_under_shard_map(tmp_path):
  run = hostcall.metrics.Run("g", root=tmp_path, writers=["memory"])

  def per_device(x):
    return jax.grad(lambda x: jnp.sum(run.log_grad(0, x=x) ** 2))(x)

  jax.jit(jax.shard_map(per_device, mesh=MESH, in_specs=P("i"),
                        out_specs=P("i")))(_x())
  rows = sorted(run.records(), key=lambda r: r["device"])
  assert [r["device"] for r in rows] == [0, 1, 2, 3]
  for d, row in enumerate(rows):
    assert row["grad_norm/x"] == pytest.approx(
        float(np.linalg.norm([4.0 * d, 4.0 * d + 2.0])))
  run.close()
