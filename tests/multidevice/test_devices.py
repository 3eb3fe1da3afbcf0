"""Taps and calls on 4 CPU devices: pmap, shard_map and sharded jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from hostcall import host_callback as hcb

assert jax.device_count() == 4, "run with --xla_force_host_platform_device_count=4"


def _by_device(recorder):
  per_device = {}
  for arg, _, device in recorder.calls:
    per_device.setdefault(device.id, []).append(
        jax.tree_util.tree_map(lambda a: a.tolist(), arg))
  return per_device


def test_pmap_one_call_per_device_with_its_slice(recorder):
  out = jax.pmap(lambda x: hcb.id_tap(recorder, x, tap_with_device=True) * 2)(
      jnp.arange(4.0))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, [0.0, 2.0, 4.0, 6.0])
  assert _by_device(recorder) == {i: [float(i)] for i in range(4)}


def test_pmap_keeps_per_device_order_of_several_taps(recorder):
  def loop(x):
    def body(c, _):
      hcb.id_tap(recorder, (c, 0), tap_with_device=True)
      hcb.id_tap(recorder, (c, 1), tap_with_device=True)
      return c + 1, None
    return lax.scan(body, x, None, length=3)[0]
  jax.pmap(loop)(jnp.arange(4) * 10)
  hcb.barrier_wait()
  assert _by_device(recorder) == {
      d: [(10 * d + i, k) for i in range(3) for k in range(2)]
      for d in range(4)}


def test_pmap_id_print_with_device(stream):
  def power3(x):
    y = x * x
    hcb.id_print((x, y), what="x,x^2", tap_with_device=True,
                 output_stream=stream)
    return y * x
  jax.pmap(power3, devices=jax.local_devices()[:2])(np.array([3.0, 4.0]))
  hcb.barrier_wait()
  lines = stream.getvalue().splitlines()
  pairs = sorted(zip(lines[0::2], lines[1::2]))
  d0, d1 = jax.local_devices()[:2]
  assert pairs == [(f"device: {d0} what: x,x^2", "( 3. 9. )"),
                   (f"device: {d1} what: x,x^2", "( 4. 16. )")]


def test_pmap_call_returns_each_device_its_result():
  devices = []

  def host_sin(x, *, device):
    devices.append(device.id)
    return np.sin(x)

  out = jax.pmap(lambda x: hcb.call(host_sin, x, result_shape=x,
                                    call_with_device=True))(
      np.ones((4, 3), np.float32) * np.arange(4, dtype=np.float32)[:, None])
  np.testing.assert_allclose(out, np.sin(np.arange(4.0))[:, None] *
                             np.ones((1, 3)), rtol=1e-6)
  assert sorted(devices) == [0, 1, 2, 3]


def test_shard_map_one_call_per_device_with_its_block(recorder):
  mesh = Mesh(np.array(jax.devices()), ("i",))
  f = jax.jit(jax.shard_map(
      lambda x: hcb.id_tap(recorder, x, tap_with_device=True) + 1,
      mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  out = f(jnp.arange(8.0))
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(8.0) + 1)
  assert _by_device(recorder) == {i: [[2.0 * i, 2.0 * i + 1]]
                                  for i in range(4)}


def test_shard_map_call_returns_to_the_right_device():
  mesh = Mesh(np.array(jax.devices()), ("i",))
  f = jax.jit(jax.shard_map(
      lambda x: hcb.call(lambda v, device: v * 0 + device.id, x,
                         result_shape=x, call_with_device=True),
      mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  np.testing.assert_array_equal(f(jnp.zeros(8)), [0, 0, 1, 1, 2, 2, 3, 3])


def test_sharded_jit_gathers_to_one_call(recorder):
  mesh = Mesh(np.array(jax.devices()), ("i",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
  out = jax.jit(lambda x: hcb.id_tap(recorder, x, tap_with_device=True) * 2)(x)
  hcb.barrier_wait()
  np.testing.assert_array_equal(out, np.arange(8.0) * 2)
  assert _by_device(recorder) == {0: [list(np.arange(8.0))]}


def test_sharded_jit_device_index_chooses_the_caller(recorder):
  mesh = Mesh(np.array(jax.devices()), ("i",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
  jax.jit(lambda x: hcb.id_tap(recorder, x, tap_with_device=True,
                               device_index=2))(x)
  hcb.barrier_wait()
  assert list(_by_device(recorder)) == [2]


def test_sharded_jit_call_result_is_resharded():
  mesh = Mesh(np.array(jax.devices()), ("i",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
  out = jax.jit(lambda x: hcb.call(lambda v: v[::-1].copy(), x,
                                   result_shape=x))(x)
  np.testing.assert_array_equal(out, np.arange(8.0)[::-1])


def test_device_index_out_of_range_is_a_clear_error():
  mesh = Mesh(np.array(jax.devices()), ("i",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
  with pytest.raises(ValueError, match="device_index=7 is out of range"):
    jax.jit(lambda x: hcb.id_tap(lambda *a: None, x, device_index=7))(x)


def test_async_taps_under_pmap_and_shard_map_keep_per_device_order(recorder):
  def loop(x):
    def body(c, _):
      hcb.id_tap(recorder, c, tap_with_device=True, delivery="async")
      return c + 1, None
    return lax.scan(body, x, None, length=3)[0]
  jax.pmap(loop)(jnp.arange(4) * 10)
  hcb.barrier_wait()
  assert _by_device(recorder) == {d: [10 * d + i for i in range(3)]
                                  for d in range(4)}
  recorder.calls.clear()
  mesh = Mesh(np.array(jax.devices()), ("i",))
  f = jax.jit(jax.shard_map(
      lambda x: hcb.id_tap(recorder, x, tap_with_device=True,
                           delivery="async"),
      mesh=mesh, in_specs=P("i"), out_specs=P("i")))
  f(jnp.arange(8.0))
  hcb.barrier_wait()
  assert _by_device(recorder) == {i: [[2.0 * i, 2.0 * i + 1]]
                                  for i in range(4)}


def test_async_tap_under_sharded_jit_is_gathered(recorder):
  mesh = Mesh(np.array(jax.devices()), ("i",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
  jax.jit(lambda x: hcb.id_tap(recorder, x, tap_with_device=True,
                               delivery="async"))(x)
  hcb.barrier_wait()
  assert _by_device(recorder) == {0: [list(np.arange(8.0))]}
