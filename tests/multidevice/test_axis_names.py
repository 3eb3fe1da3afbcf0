"""call_context().axis_indices names each mapped axis as the user did: a
pmap without axis_name by None (JAX's own name for it is internal)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcall


def _seen_under(mapped, flavour):
  seen = []

  def host(v):
    context = hostcall.call_context()
    seen.append((context.device.id, dict(context.axis_indices),
                 float(np.ravel(v)[0])))
    return v

  def body(v):
    if flavour == "debug_callback":
      hostcall.debug_callback(host, v)
      return v
    return getattr(hostcall, flavour)(
        host, jax.ShapeDtypeStruct(v.shape, v.dtype), v)

  out = mapped(body)
  hostcall.barrier()
  return out, sorted(seen, key=lambda s: s[2])


def test_each_device_of_an_unnamed_pmap_learns_its_index_under_none():
  devices = jax.devices()[::-1]
  for flavour in ("debug_callback", "pure_callback", "io_callback"):
    out, seen = _seen_under(lambda body: jax.pmap(body, devices=devices)(
        jnp.arange(4.0) * 10), flavour)
    np.testing.assert_array_equal(out, np.arange(4.0) * 10)
    assert seen == [(devices[i].id, {None: i}, 10.0 * i) for i in range(4)]


def test_a_named_pmap_and_a_shard_map_keep_their_names():
  _, seen = _seen_under(lambda body: jax.pmap(body, axis_name="batch")(
      jnp.arange(4.0)), "debug_callback")
  assert [s[1] for s in seen] == [{"batch": i} for i in range(4)]
  mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
  x = jax.device_put(jnp.arange(4.0).reshape(2, 2),
                     NamedSharding(mesh, P("a", "b")))
  _, seen = _seen_under(lambda body: jax.jit(jax.shard_map(
      body, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a", "b")))(x),
                        "debug_callback")
  assert [s[1] for s in seen] == [{"a": a, "b": b}
                                  for a in range(2) for b in range(2)]
