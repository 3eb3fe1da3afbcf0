"""partitioned=True: one host call per shard, told its place, no all-gather."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcall
from hostcall import host_callback as hcb

MESH = Mesh(np.array(jax.devices()), ("x",))
MESH2 = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
GLOBAL = np.arange(16.0, dtype=np.float32).reshape(8, 2)
_lock = threading.Lock()

CASES = {
    "rows over 4 devices": (NamedSharding(MESH, P("x")), lambda x: x),
    "2x2 mesh": (NamedSharding(MESH2, P("a", "b")), lambda x: x),
    "replicated": (NamedSharding(MESH, P()), lambda x: x),
    "made inside with a constraint": (
        NamedSharding(MESH2, P()),
        lambda x: jax.lax.with_sharding_constraint(
            x * 1, NamedSharding(MESH2, P("b", "a")))),
    "propagated through a reshape": (
        NamedSharding(MESH, P("x")), lambda x: (x + 1).reshape(4, 4) - 1),
}


def _recorder(calls):
  def record(value):
    context = hostcall.call_context()
    with _lock:
      calls.append((context.device.id, context.shard_indices,
                    np.asarray(value).copy()))
  return record


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("flavour", ["id_tap", "debug_callback",
                                     "io_callback", "id_tap async"])
def test_every_shard_arrives_once_with_its_place(case, flavour):
  sharding, make = CASES[case]
  calls = []
  record = _recorder(calls)
  staged = {
      "id_tap": lambda v: hcb.id_tap(lambda a, t: record(a), v,
                                     partitioned=True),
      "id_tap async": lambda v: hcb.id_tap(lambda a, t: record(a), v,
                                           partitioned=True, delivery="async"),
      "debug_callback": lambda v: hostcall.debug_callback(
          record, v, partitioned=True),
      "io_callback": lambda v: hostcall.io_callback(record, None, v,
                                                    partitioned=True),
  }[flavour]

  def f(x):
    value = make(x)
    staged(value)
    return value

  x = jax.device_put(GLOBAL, sharding)
  value = np.asarray(jax.jit(f)(x))
  hostcall.barrier()
  assert len(calls) == 4 and sorted(d for d, _, _ in calls) == [0, 1, 2, 3]
  covered = np.zeros(value.shape, bool)
  for _, (index,), shard in calls:
    np.testing.assert_array_equal(shard, value[index])
    covered[index] = True
  assert covered.all()


def test_each_device_holds_the_shard_it_reports():
  x = jax.device_put(GLOBAL, NamedSharding(MESH2, P("a", "b")))
  calls = []
  record = _recorder(calls)
  jax.jit(lambda x: hostcall.debug_callback(record, x, partitioned=True))(x)
  hostcall.barrier()
  held = {s.device.id: np.asarray(s.data) for s in x.addressable_shards}
  for device, _, shard in calls:
    np.testing.assert_array_equal(shard, held[device])


def test_uneven_shards_are_trimmed_and_padding_only_devices_skipped():
  calls = []
  record = _recorder(calls)

  def f(x):
    v = jax.lax.with_sharding_constraint(x[:6] * 1, NamedSharding(MESH, P("x")))
    hcb.id_tap(lambda a, t: record(a), v, partitioned=True)

  jax.jit(f)(jax.device_put(np.arange(16.0), NamedSharding(MESH, P())))
  hostcall.barrier()
  got = sorted((idx[0].start, shard.tolist()) for _, (idx,), shard in calls)
  assert got == [(0, [0.0, 1.0]), (2, [2.0, 3.0]), (4, [4.0, 5.0])]


@pytest.mark.parametrize("shape", [(1,), (1, 7), (1, 2, 2), (3,), (2, 1),
                                   (5, 1, 3)])
@pytest.mark.parametrize("delivery", ["sync", "async"])
def test_a_dimension_shorter_than_the_devices_is_never_padding(shape,
                                                               delivery):
  # Sharded four ways, a dimension of size 1 (or 3) leaves devices holding
  # only XLA's padding: they are not called, and no element comes twice.
  calls = []
  record = _recorder(calls)
  size = int(np.prod(shape))
  expected = np.arange(1, 1 + size, dtype=np.float32).reshape(shape)

  def f(x):
    v = jax.lax.with_sharding_constraint(x * 1, NamedSharding(MESH, P("x")))
    hcb.id_tap(lambda a, t: record(a), v, partitioned=True, delivery=delivery)

  jax.jit(f)(expected)
  hostcall.barrier()
  seen = np.zeros(shape, int)
  for _, (index,), shard in calls:
    assert shard.tolist() == expected[index].tolist()
    seen[index] += 1
  assert seen.tolist() == np.ones(shape, int).tolist()


def test_several_operands_each_get_their_index():
  calls = []

  def tap(arg, transforms):
    with _lock:
      calls.append((hostcall.call_context().shard_indices,
                    jax.tree_util.tree_map(np.asarray, arg)))

  a = jax.device_put(GLOBAL, NamedSharding(MESH, P("x")))
  b = jax.device_put(np.arange(4.0), NamedSharding(MESH, P()))
  jax.jit(lambda a, b: hcb.id_tap(tap, (a, b), partitioned=True))(a, b)
  hostcall.barrier()
  assert len(calls) == 4
  for (index_a, index_b), (shard_a, shard_b) in calls:
    np.testing.assert_array_equal(shard_a, GLOBAL[index_a])
    assert index_b == (slice(0, 4),)
    np.testing.assert_array_equal(shard_b, np.arange(4.0))


def test_debug_print_partitioned_prints_what_jax_prints():
  import contextlib
  import io

  x = jax.device_put(np.arange(8.0, dtype=np.float32), NamedSharding(MESH, P("x")))
  outputs = {}
  for name, impl in (("jax", jax.debug.print), ("hostcall", hostcall.debug_print)):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      jax.jit(lambda x: impl("x={x}", x=x, partitioned=True))(x)
      jax.effects_barrier()
      hostcall.barrier()
    outputs[name] = sorted(out.getvalue().splitlines())
  assert outputs["jax"] == outputs["hostcall"] == [
      "x=[0. 1.]", "x=[2. 3.]", "x=[4. 5.]", "x=[6. 7.]"]


def test_partitioned_without_several_devices_is_one_call():
  calls = []
  record = _recorder(calls)
  jax.jit(lambda x: hostcall.debug_callback(record, x, partitioned=True),
          device=None)(jax.device_put(GLOBAL, jax.devices()[1]))
  hostcall.barrier()
  assert len(calls) == 1 and calls[0][1] is None
  np.testing.assert_array_equal(calls[0][2], GLOBAL)


def test_partitioned_io_callback_with_results_is_refused():
  with pytest.raises(ValueError, match="cannot return results"):
    hostcall.io_callback(lambda v: v, jax.ShapeDtypeStruct((), jnp.float32),
                         1.0, partitioned=True)


def test_ordered_taps_around_a_partitioned_one_keep_their_order():
  # A partitioned call is not ordered (no token can ride along); the ordered
  # taps around it keep theirs.
  log = []

  def f(x):
    hcb.id_tap(lambda a, t: log.append("first"), 0)
    hcb.id_tap(lambda a, t: log.append("shard"), x, partitioned=True)
    hcb.id_tap(lambda a, t: log.append("second"), 0)
    return x

  jax.jit(f)(jax.device_put(GLOBAL, NamedSharding(MESH, P("x"))))
  hostcall.barrier()
  assert [e for e in log if e != "shard"] == ["first", "second"]
  assert log.count("shard") == 4
