"""JAX's callback programs that need several devices (4 CPU devices here),
run with JAX's callbacks and with hostcall's and compared."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from tests.jax_suite._harness import both, norm, same

assert jax.device_count() == 4


def mesh(*shape, names=("x",)):
  n = int(np.prod(shape))
  return jax.sharding.Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def chunks(text, lines):
  """Printed text as a multiset of ``lines``-line blocks."""
  rows = text.strip().split("\n")
  return collections.Counter("\n".join(rows[i:i + lines])
                             for i in range(0, len(rows), lines))


def same_blocks(program, lines):
  j, h = same(program, lines_ordered=False, ordered=False)
  assert chunks(h.printed, lines) == chunks(j.printed, lines), (j.printed, h.printed)
  return j, h


def test_partitioned_print_of_a_3d_array():
  def program(cb, log):
    m = mesh(1, 1, 2, names=("x", "y", "z"))
    arr = jax.device_put(np.arange(24).reshape(2, 3, 4),
                         jax.NamedSharding(m, jax.P("x", "y", "z")))
    with jax.set_mesh(m):
      jax.jit(lambda x: cb.print("hello: {x}", x=x, partitioned=True))(arr)
  j, _ = same_blocks(program, 7)
  assert len(chunks(j.printed, 7)) == 2


@pytest.mark.parametrize("vmaps", [1, 2])
def test_partitioned_print_under_vmap(vmaps):
  def program(cb, log):
    m = mesh(1, 1, 2, names=("x", "y", "z"))
    arr = jax.device_put(np.arange(24).reshape(2, 3, 4),
                         jax.NamedSharding(m, jax.P("x", "y", "z")))
    f = lambda x: cb.print("hello: {}", x, partitioned=True)
    for _ in range(vmaps):
      f = jax.vmap(f)
    with jax.set_mesh(m):
      jax.jit(f)(arr)
  same_blocks(program, 3 if vmaps == 1 else 1)


def test_partitioned_print_under_vmap_with_different_axes():
  def program(cb, log):
    m = mesh(2)
    s = jax.NamedSharding(m, jax.P("x"))
    x = jax.device_put(np.arange(4).reshape(2, 2), s)
    y = jax.device_put(np.arange(4).reshape(2, 2) + 6, s)
    with jax.set_mesh(m):
      jax.jit(jax.vmap(lambda a, b: cb.print("hello: {} {}", a, b,
                                             partitioned=True),
                       in_axes=(0, 1)))(x, y)
  j, _ = same_blocks(program, 1)
  assert set(j.printed.split("\n")) - {""} == {
      "hello: [2 3] [9]", "hello: [0 1] [6]", "hello: [0 1] [8]",
      "hello: [2 3] [7]"}


def test_unordered_print_of_a_sharded_array_prints_it_whole():
  def program(cb, log):
    m = mesh(4)
    f = jax.jit(lambda x: (cb.print("{}", x), x.dot(x))[1],
                in_shardings=jax.NamedSharding(m, jax.P("x")),
                out_shardings=jax.NamedSharding(m, jax.P()))
    with jax.set_mesh(m):
      return f(np.arange(8, dtype=np.int32))
  j, _ = same(program)
  assert j.printed == "[0 1 2 3 4 5 6 7]\n"


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize("last_device", [True, False])
def test_io_callbacks_in_jit_over_four_devices(ordered, last_device):
  def program(cb, log):
    m = mesh(4)
    kwargs = dict(ordered=ordered)
    if last_device:
      kwargs["sharding"] = jax.sharding.SingleDeviceSharding(jax.devices()[-1])
    host = lambda x: log.append(int(x.sum()))
    def f(x):
      cb.io(host, None, x, **kwargs)
      cb.io(host, None, x + 1, **kwargs)
      return x
    f = jax.jit(f, in_shardings=jax.NamedSharding(m, jax.P("x")),
                out_shardings=jax.NamedSharding(m, jax.P()))
    x = jnp.arange(4)
    return f(x), f(x + 5)
  same(program, ordered=ordered)


def test_ordered_io_callbacks_over_changing_device_assignments():
  import time
  def program(cb, log):
    def host(i, x):
      time.sleep([0.004, 0.0, 0.008][len(log) % 3])
      log.append((int(i), int(x.sum())))
    devices = jax.devices()
    for i in range(4):
      m = jax.sharding.Mesh(np.array([devices[i % 4], devices[(i + 1) % 4]]),
                            ("x",))
      f = jax.jit(lambda i, x: (cb.io(host, None, i, x, ordered=True),
                                cb.io(host, None, i, x + 1, ordered=True)),
                  in_shardings=(jax.NamedSharding(m, jax.P()),
                                jax.NamedSharding(m, jax.P("x"))),
                  out_shardings=jax.NamedSharding(m, jax.P()))
      x = jax.device_put(np.arange(2, dtype=np.int32) + 10 * i,
                         jax.NamedSharding(m, jax.P("x")))
      f(i, x)
      f(i, x + 5)
  same(program)


def test_ordered_io_callbacks_per_shard_in_shard_map():
  def program(cb, log):
    m = mesh(4)
    def f(ids, x):
      cb.io(lambda i, v: log.append((int(i[0]), norm(v))), None, ids, x,
            ordered=True)
      cb.io(lambda i, v: log.append((int(i[0]), norm(v))), None, ids, x + 1,
            ordered=True)
    f = jax.shard_map(f, mesh=m, in_specs=jax.P("x"), out_specs=None)
    return jax.jit(f)(jnp.arange(4), jnp.arange(8))
  j, h = same(program, ordered=False)
  for outcome in (j, h):  # in each shard, the two calls in program order
    per_shard = collections.defaultdict(list)
    for shard, v in outcome.calls:
      per_shard[shard].append(v)
    assert len(per_shard) == 4, outcome.calls
    for calls in per_shard.values():
      assert len(calls) == 2
      assert np.array_equal(np.array(eval(calls[0].values)) + 1,
                            np.array(eval(calls[1].values)))


@pytest.mark.parametrize("pinned", [False, True])
def test_pure_callback_over_four_devices(pinned):
  def program(cb, log):
    m = mesh(4)
    s = jax.NamedSharding(m, jax.P("x"))
    kwargs = {}
    if pinned:
      kwargs["sharding"] = jax.sharding.SingleDeviceSharding(jax.devices()[-1])
    host = lambda v: log.append(norm(v)) or v + np.arange(v.shape[0], dtype=v.dtype)
    f = jax.jit(lambda x: cb.pure(host, x, x, **kwargs), in_shardings=s,
                out_shardings=s)
    return f(jnp.arange(4.))
  j, _ = same(program)
  assert j.value == norm(np.arange(4.).astype(np.float32) * 2)


def test_pure_callback_per_shard_in_shard_map():
  def program(cb, log):
    m = mesh(4)
    spec = jax.P("x")
    f = jax.shard_map(lambda x: cb.pure(
        lambda v: log.append(norm(v)) or v + np.arange(v.shape[0], dtype=v.dtype),
        x, x), mesh=m, in_specs=(spec,), out_specs=spec)
    return jax.jit(f)(jnp.arange(8.))
  same(program, ordered=False)


@pytest.mark.parametrize("kind", ["pure", "io_unordered"])
def test_callback_under_pmap(kind):
  def program(cb, log):
    f = jax.pmap(lambda x: cb.kind(kind)(
        lambda v: log.append(norm(v)) or v + 1., x, x))
    return f(jnp.arange(8.).reshape(4, 2))
  same(program, ordered=False)


@pytest.mark.parametrize("flavour", ["print", "debug"])
def test_ordered_debug_callback_under_pmap_is_refused_as_in_jax(flavour):
  # JAX refuses ordered debug effects on several devices; so does hostcall,
  # with JAX's own ValueError (ordered io callbacks are allowed, by both).
  def program(cb, log):
    if flavour == "print":
      body = lambda x: cb.print("{}", x, ordered=True)
    else:
      body = lambda x: cb.debug(lambda v: log.append(norm(v)), x, ordered=True)
    return jax.pmap(body)(jnp.arange(4))
  j, h = same(program, error=ValueError,
              words=("ordered effects are not supported for more than 1 "
                     "device",))
  assert j.printed == h.printed == "" and j.calls == h.calls == []


def test_ordered_debug_print_in_jit_over_four_devices_is_refused_as_in_jax():
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("x",))
  sharded = jax.device_put(jnp.arange(8.), jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec("x")))
  same(lambda cb, log: jax.jit(lambda x: (cb.print("{}", x, ordered=True),
                                          x + 1)[1])(sharded),
       error=ValueError,
       words=("ordered effects are not supported for more than 1 device",))


def test_unordered_prints_under_pmap_and_pmap_of_while():
  def program(cb, log):
    jax.pmap(lambda x: (cb.print("hello: {}", x), cb.print("hello: {}", x + 4)))(
        jnp.arange(4))
    jax.effects_barrier()
    def f(x):
      def body(x):
        cb.print("while: {}", x)
        return x + 1
      return lax.while_loop(lambda x: x < 3, body, x)
    return jax.pmap(f)(jnp.arange(4))
  same(program, lines_ordered=False)
