"""Host calls on 4 devices where transformations compose (issue 39): a
host function learns which block of the global array (or which part of a
``pmap``'s batch) it holds. (One failed ordered call failing only its own
computation, JAX #37587: ``test_fault_matrix.py``, on either route into the queue.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcall

assert jax.device_count() == 4, "run with --xla_force_host_platform_device_count=4"


def _mesh(devices=None):
  return Mesh(np.array(devices or jax.devices()), ("x",))


@pytest.mark.parametrize("reverse", [False, True])
def test_shard_map_tells_each_device_its_block(reverse):
  devices = jax.devices()[::-1] if reverse else jax.devices()
  mesh = _mesh(devices)
  seen = []
  x = jnp.arange(8.0)

  def host(block):
    context = hostcall.call_context()
    seen.append((context.device.id, context.axis_indices, block.tolist()))

  f = jax.jit(jax.shard_map(lambda b: (hostcall.debug_callback(host, b),
                                       b)[1],
                            mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  f(jax.device_put(x, NamedSharding(mesh, P("x"))))
  hostcall.barrier()
  assert len(seen) == 4
  for device_id, indices, block in seen:
    i = indices["x"]
    assert devices[i].id == device_id
    assert block == x[2 * i:2 * i + 2].tolist()  # the block it names


def test_a_two_axis_mesh_names_both_indices():
  mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
  seen = {}
  x = jnp.arange(16.0).reshape(4, 4)

  def host(block):
    indices = hostcall.call_context().axis_indices
    seen[indices["a"], indices["b"]] = block

  f = jax.jit(jax.shard_map(lambda b: (hostcall.debug_callback(host, b),
                                       b)[1], mesh=mesh,
                            in_specs=P("a", "b"), out_specs=P("a", "b")))
  f(jax.device_put(x, NamedSharding(mesh, P("a", "b"))))
  hostcall.barrier()
  assert sorted(seen) == [(0, 0), (0, 1), (1, 0), (1, 1)]
  for (a, b), block in seen.items():
    np.testing.assert_array_equal(block, x[2 * a:2 * a + 2, 2 * b:2 * b + 2])


def test_pmap_with_reordered_devices_tells_each_call_its_batch_index():
  devices = jax.devices()[::-1]
  seen = []

  def host(v):
    context = hostcall.call_context()
    seen.append((context.device.id, context.axis_indices["i"], float(v)))

  f = jax.pmap(lambda v: (hostcall.debug_callback(host, v), v)[1],
               axis_name="i", devices=devices)
  f(jnp.arange(4.0) * 10)
  hostcall.barrier()
  # Element i of the batch ran on devices[i], which says it holds index i.
  assert sorted(seen, key=lambda s: s[1]) == [
      (devices[i].id, i, 10.0 * i) for i in range(4)]


@pytest.mark.parametrize("flavour", ["io_callback", "id_tap"])
def test_ordered_calls_from_different_devices_in_branches_returning_a_token(
    flavour):
  # Each branch of the switch returns only the ordering token of its call,
  # made by a different device: the tokens' shardings (MAXIMAL on device 0,
  # on device 3) made XLA's verifier refuse the conditional ("Inconsistent
  # conditional sharding among instructions"). Under grad, partial
  # evaluation leaves such branches too.
  from hostcall import host_callback as hcb
  mesh = _mesh()
  seen = []

  def call(x, device):
    record = lambda v: seen.append((device, np.asarray(v).tolist()))
    if flavour == "io_callback":
      hostcall.io_callback(
          record, None, x, ordered=True,
          sharding=jax.sharding.SingleDeviceSharding(jax.devices()[device]))
      return x
    return hcb.id_tap(lambda v, t: record(v), x, device_index=device)

  def f(x):
    return jax.lax.switch(jnp.int32(jnp.sum(x)) % 2,
                          [lambda x: call(x, 0), lambda x: call(x, 3)], x)
  g = jax.jit(jax.grad(lambda x: jnp.sum(3.0 * f(x)) + jnp.sum(x ** 2)))
  for x in (jnp.arange(4.0), jnp.arange(4.0) + 0.25):
    out = g(jax.device_put(x, NamedSharding(mesh, P("x"))))
    hostcall.barrier()
    np.testing.assert_array_equal(np.asarray(out), 3.0 + 2 * np.asarray(x))
  assert seen == [(0, [0.0, 1.0, 2.0, 3.0]), (3, [0.25, 1.25, 2.25, 3.25])]
