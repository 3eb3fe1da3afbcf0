"""hostcall.jit on 4 CPU devices: the same host calls (device, value) as
jax.jit under a global view, shard_map and pmap."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcall
from hostcall import host_callback as hcb
from hostcall._jit import deferrable, routes

MESH = Mesh(np.array(jax.devices()), ("i",))
SHARDED = NamedSharding(MESH, P("i"))


def _x():
  return jax.device_put(jnp.arange(8.0), SHARDED)


def _recording(log, label):
  def host(*args):
    log.append((label, hostcall.call_context().device.id,
                [np.asarray(a).tolist() for a in args]))
  return host


def _global_view(log, x):
  hostcall.debug_callback(_recording(log, "whole"), x)
  hcb.id_tap(lambda v, t: log.append(("second", hostcall.call_context(
      ).device.id, [np.asarray(v).tolist()])), x * 2, device_index=1)
  y = jnp.sin(x)
  hcb.id_tap(lambda v, t: log.append(("tap", None, [np.asarray(v).tolist()])),
             y.sum())
  return y


def _shard_mapped(log, x):
  def per_device(block):
    hostcall.debug_callback(_recording(log, "shard"), block)
    return block * 2
  return jax.shard_map(per_device, mesh=MESH, in_specs=P("i"),
                       out_specs=P("i"))(x)


def _pmapped(log, x):
  return jax.pmap(lambda v: (hostcall.debug_callback(
      _recording(log, "pmap"), v), v + 1)[1])(x.reshape(4, 2))


@pytest.mark.parametrize("program", [_global_view, _shard_mapped, _pmapped],
                         ids=lambda p: p.__name__)
def test_same_host_calls_as_jax_jit(program):
  logs = []
  for jit in (jax.jit, hostcall.jit):
    log = []
    x = np.arange(8.0, dtype=np.float32) if program is _pmapped else _x()
    out = jit(functools.partial(program, log))(x)
    hostcall.barrier()
    logs.append((sorted(log, key=repr), np.asarray(out).tolist()))
  assert logs[0] == logs[1]
  assert logs[0][0]


def test_a_global_view_program_is_deferred_and_a_per_device_one_is_not():
  x = _x()
  assert deferrable.AS_OUTPUTS.analyse(jax.make_jaxpr(
      functools.partial(_global_view, []))(x)) is True
  assert deferrable.AS_OUTPUTS.analyse(jax.make_jaxpr(
      functools.partial(_shard_mapped, []))(x)) is None
  log = []
  hostcall.jit(functools.partial(_global_view, log))(x)
  hostcall.barrier()
  assert ("whole", 0, [list(np.arange(8.0))]) in log


def test_calls_of_one_trace_on_different_devices_name_their_own_device():
  # One trace, committed to a different device each call: the calls wait
  # together behind a busy host function, and each is told its device.
  import threading
  seen = []
  busy = threading.Event()

  @hostcall.jit
  def hold(x):
    hostcall.debug_callback(lambda v: busy.wait(60), x)
    return x

  @hostcall.jit
  def step(x):
    hostcall.debug_callback(lambda v: seen.append(
        (float(v), hostcall.call_context().device.id)), x)
    return x + 1

  hold(np.float32(0))
  for i in range(6):
    step(jax.device_put(jnp.float32(i), jax.devices()[i % 3]))
  busy.set()
  hostcall.barrier()
  # Queued from the devices, in the order the devices made them: each
  # device's in the order dispatched (the CPU runtime runs several devices'
  # programs in no set order among them).
  assert sorted(seen) == [(float(i), i % 3) for i in range(6)]
  for device in range(3):
    assert [v for v, d in seen if d == device] == [
        float(i) for i in range(6) if i % 3 == device]


def test_an_inlined_jit_keeps_the_shardings_it_gave():
  seen = []
  replicated = NamedSharding(MESH, P())
  inner = jax.jit(lambda v: (hostcall.debug_callback(
      lambda a: seen.append(np.asarray(a).tolist()), v), v * 2)[1],
      in_shardings=SHARDED, out_shardings=SHARDED)

  def outer(x):
    y = inner(x)
    return y, y + 1

  x = jax.device_put(jnp.arange(8.0), replicated)
  specs = []
  for jit in (jax.jit, hostcall.jit):
    y, z = jit(outer)(x)
    hostcall.barrier()
    specs.append((y.sharding.spec, z.sharding.spec))
    assert y.tolist() == [2.0 * i for i in range(8)]
  assert specs[0] == specs[1] == (P("i"), P("i"))
  assert seen == [list(np.arange(8.0))] * 2
  assert deferrable.AS_OUTPUTS.analyse(jax.make_jaxpr(outer)(x)) is True


def test_an_inlined_jit_on_a_mesh_of_explicit_axes_is_as_under_jax_jit():
  # There a sharding is the value's type: jax.jit does not reshard a
  # nested jit's results to its out_shardings, nor may hostcall.jit.
  mesh = jax.make_mesh((4,), ("i",),
                       axis_types=(jax.sharding.AxisType.Explicit,))
  got = []
  for jit in (jax.jit, hostcall.jit):
    seen = []
    with jax.set_mesh(mesh):
      inner = jax.jit(lambda v: (hostcall.debug_callback(
          lambda a: seen.append(np.asarray(a).tolist()), v), v + 1)[1],
          out_shardings=P("i"))
      x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P()))
      y = jit(lambda v: inner(v) * 2)(x)
      hostcall.barrier()
    got.append((str(jax.typeof(y)), y.sharding.spec, y.tolist(), seen))
  assert got[0] == got[1]
  assert got[1][2] == [2.0 * (i + 1) for i in range(8)]
  assert got[1][3] == [list(np.arange(8.0))]


@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
def test_a_loops_calls_on_values_sharded_over_a_mesh_axis_as_under_jax_jit(
    axis_type):
  # The calls' values become outputs (a global view); sharded over an
  # explicit axis, they are replicated before they are flattened (which
  # JAX refuses for such a value: the call failed before).
  mesh = jax.make_mesh((4,), ("d",), axis_types=(
      getattr(jax.sharding.AxisType, axis_type),))
  x = jax.device_put(jnp.arange(16.0).reshape(4, 4), NamedSharding(
      mesh, P("d")))

  def program(seen):
    def body(i, c):
      jax.debug.callback(lambda i, c: seen.append(
          (int(i), np.asarray(c).tolist())), i, c)
      return c * 1.5
    return lambda v: jax.lax.fori_loop(0, 3, body, v)
  got = []
  for jit in (jax.jit, hostcall.jit):
    seen = []
    y = jit(program(seen))(x)
    hostcall.barrier()
    got.append((y.sharding.spec, y.tolist(), seen))
  assert got[0] == got[1]
  assert [i for i, _ in got[1][2]] == [0, 1, 2]
  assert got[1][2][2][1] == (np.arange(16.0).reshape(4, 4) * 2.25).tolist()


def _taps_and_calls(seen):
  """A jax.jit program's asynchronous tap and a hostcall.jit program's
  (queued) tap, each recording ``(name, value)``."""
  tapped = jax.jit(lambda x: hcb.id_tap(
      lambda v, t: seen.append(("A", int(np.asarray(v).ravel()[0]))), x,
      delivery="async"))
  queued = hostcall.jit(lambda x: hcb.id_tap(
      lambda v, t: seen.append(("B", int(np.asarray(v).ravel()[0]))), x))
  return tapped, queued


# A global view's calls become outputs; the program queues a marker where it
# runs, and the queue's consumer replays its calls there (issue 52).
_PLACES = {
    "one device": lambda k: np.int32(k),
    "device 2": lambda k: jax.device_put(np.int32(k), jax.devices()[2]),
    "global view": lambda k: jax.device_put(jnp.full((8,), k, jnp.int32),
                                            SHARDED),
}
_ORDER_PLACES = list(_PLACES)


def _interleaved(where, order: str) -> list:
  """What the host got from 200 steps each calling the jax.jit program
  ("A") and the hostcall.jit one ("B") in ``order``, on ``where``'s
  values, then a barrier."""
  seen = []
  programs = dict(zip("AB", _taps_and_calls(seen)))
  place = _PLACES[where]
  for k in range(200):
    for name in order:
      programs[name](place(k))
  hostcall.barrier()
  return seen


@pytest.mark.parametrize("where", _ORDER_PLACES)
def test_an_earlier_programs_asynchronous_taps_come_first(where):
  # A jax.jit program's asynchronous taps and a later hostcall.jit
  # program's calls reach the host in the order the programs ran, on
  # several devices too (issue 42: the later program's came first in most
  # steps when its calls became outputs), with either route into the queue
  # (tests/test_multidevice.py runs this with HOSTCALL_NATIVE=0 too).
  assert _interleaved(where, "AB") == [
      (name, k) for k in range(200) for name in "AB"]


@pytest.mark.parametrize("where", _ORDER_PLACES)
def test_a_later_programs_asynchronous_taps_come_after(where):
  # The reverse interleaving: hostcall.jit's calls first, then jax.jit's
  # asynchronous taps. (Its program is small, run when dispatched: a
  # jax.jit program with an effect may overtake a long one still running,
  # on one device too, which docs/performance.md says.)
  assert _interleaved(where, "BA") == [
      (name, k) for k in range(200) for name in "BA"]


def _slow_then_tap(seen, steps=200):
  """A program whose host call comes after a long computation (``steps``
  256x256 matmuls: 200 take about 50 ms on a CPU device), so that it
  still runs when the caller reaches the barrier; the call records the
  result's first element."""
  def program(x):
    m = jnp.full((256, 256), 1.0 / 256, jnp.float32)
    y = jax.lax.fori_loop(0, steps, lambda i, a: jnp.tanh(a @ m) + x[0],
                          m)
    hostcall.debug_callback(lambda v: seen.append(float(v)), y[0, 0])
    return y[0, 0]
  return program


def _slow_input(where):
  x = jnp.full((8,), 0.5, jnp.float32)
  if where == "global view":
    return jax.device_put(x, SHARDED)
  return jax.device_put(x, jax.devices()[int(where.split()[-1])])


@pytest.mark.parametrize("where", ["device 0", "device 3", "global view"])
def test_a_barrier_waits_for_a_queued_call_after_a_long_computation(where):
  # The barrier waits for the queueing program itself (its last call's
  # order value), not for a program dispatched after it: on several
  # devices the CPU runtime does not run programs in dispatch order.
  seen = []
  slow = hostcall.jit(_slow_then_tap(seen))
  x = _slow_input(where)
  expected = float(jax.jit(_slow_then_tap([]))(x))
  hostcall.barrier()
  assert routes.queues()  # (the route this test is for)
  for _ in range(3):
    del seen[:]
    out = slow(x)
    hostcall.barrier()
    assert seen == [expected]
    assert float(out) == expected


@pytest.mark.parametrize("where", ["device 1", "global view"])
def test_a_program_dropped_before_the_barrier_still_delivers(where):
  # Its function deleted (and its executable, which owns its call sites)
  # right after dispatch: the barrier still waits for its calls, and the
  # sites are forgotten only after it.
  import gc
  seen = []
  x = _slow_input(where)
  expected = float(jax.jit(_slow_then_tap([], steps=1500))(x))
  outs = []
  for i in range(3):
    # (Long enough to outlast gc.collect(), about 0.1 s here.)
    slow = hostcall.jit(_slow_then_tap(seen, steps=1500))
    outs.append(slow(x))
    del slow
    gc.collect()
    hostcall.barrier()
    assert seen == [expected] * (i + 1)
  jax.block_until_ready(outs)
  hostcall.barrier()
  assert seen == [expected] * 3
  assert [float(out) for out in outs] == [expected] * 3


@pytest.mark.parametrize("where", ["device 1", "global view"])
def test_a_barrier_in_another_thread_during_dispatch_leaves_the_call_to_the_next(
    where):
  # Review (issue 42): another thread's barrier while this thread
  # dispatches (here while it traces) must not make this thread's later
  # barrier skip the program's kept order value.
  import threading
  seen = []
  slow = _slow_then_tap(seen, steps=1500)

  def program(x):
    other = threading.Thread(target=hostcall.barrier)
    other.start()
    other.join()
    return slow(x)
  out = hostcall.jit(program)(_slow_input(where))
  hostcall.barrier()
  assert seen == [float(out)]


_COLLECTIVE = r"\b(all-reduce|all-gather|collective-permute|all-to-all|reduce-scatter)(-start)?\("


# Under a global view every device runs a queued call's custom call and
# returns its own order value; the chosen device queues. Replicating one
# device's value (an earlier version) cost an all-reduce a call, and threads
# dispatching such programs at once deadlocked at the CPU runtime's
# rendezvous (XLA aborted the process), where jax.jit runs them.
def test_a_global_view_program_gets_no_collective_jax_jit_lacks():
  import re
  replicated = NamedSharding(MESH, P())

  def program(x):
    jax.debug.callback(lambda v: None, x[0])
    hostcall.debug_callback(lambda v: None, x[1])
    return x * 2
  x = jax.device_put(jnp.ones((8,)), replicated)
  compiled = hostcall.jit(program)
  jitted = compiled._hostcall_jitted
  # The call takes the outputs route (the deferring program), which has
  # none of the queued route's replications.
  ran = []
  marked = jitted.route(routes.Marked)
  deferring = marked.program
  marked.program = lambda *a: (ran.append(1), deferring(*a))[1]
  compiled(x)
  hostcall.barrier()
  assert ran == [1]
  found = []
  for program_jit in (jax.jit(program), deferring):
    text = program_jit.lower(x).compile().as_text()
    found.append(sorted({m.group(1) for m in re.finditer(_COLLECTIVE, text)}))
  assert found[0] == [] and found[1] == found[0]


# The markers' faults (issue 52): a global view's calls are replayed where
# its marker sits in the queue; nothing may hang, be lost or run twice.

def _global_value(k):
  return jax.device_put(jnp.full((8,), k, jnp.int32), SHARDED)


def test_threads_dispatching_global_views_at_once_get_every_call_once():
  import threading
  seen = []
  lock = threading.Lock()

  def record(v, who):
    with lock:
      seen.append((int(who), int(np.asarray(v).ravel()[0])))
  programs = [hostcall.jit(functools.partial(
      lambda who, x: hcb.id_tap(lambda v, t: record(v, who), x), who))
      for who in range(3)]

  def run(who):
    for k in range(60):
      programs[who](_global_value(k))
  threads = [threading.Thread(target=run, args=(w,)) for w in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  hostcall.barrier()
  from hostcall._runtime.markers import markers
  assert markers.waiting() == 0
  for who in range(3):
    # Each thread's calls, once each, in the order it made them.
    assert [k for w, k in seen if w == who] == list(range(60))


def test_a_dispatch_that_raises_leaves_the_order_of_the_others():
  seen = []
  programs = dict(zip("AB", _taps_and_calls(seen)))
  for k in range(20):
    programs["A"](_global_value(k))
    if k == 7:
      with pytest.raises(TypeError):
        programs["B"](_global_value(k), "an argument too many")
      continue
    programs["B"](_global_value(k))
  hostcall.barrier()
  assert seen == [(name, k) for k in range(20) for name in "AB"
                  if (name, k) != ("B", 7)]


def test_a_failing_host_function_on_the_marked_route_fails_the_barrier():
  seen = []

  def host(v):
    if int(np.asarray(v).ravel()[0]) == 3:
      raise ValueError("step 3 failed")
    seen.append(int(np.asarray(v).ravel()[0]))
  program = hostcall.jit(lambda x: hostcall.debug_callback(host, x))
  for k in range(6):
    program(_global_value(k))
  with pytest.raises(hostcall.CallbackException, match="step 3 failed"):
    hostcall.barrier()
  assert seen == [0, 1, 2, 4, 5]


def test_jax_effects_barrier_waits_for_the_marked_routes_calls():
  seen = []
  program = hostcall.jit(lambda x: jax.debug.callback(
      lambda v: seen.append(int(np.asarray(v).ravel()[0])), x))
  for k in range(50):
    program(_global_value(k))
  jax.effects_barrier()
  assert seen == list(range(50))


def test_outputs_over_the_capacity_wait_for_room_and_are_all_delivered(
    monkeypatch):
  from hostcall._runtime.markers import markers
  monkeypatch.setattr(markers, "capacity", 64)  # bytes: about two calls
  seen = []
  program = hostcall.jit(lambda x: hostcall.debug_callback(
      lambda v: seen.append(int(np.asarray(v).ravel()[0])), x))
  for k in range(100):
    program(_global_value(k))
  hostcall.barrier()
  assert seen == list(range(100))
  assert markers.waiting() == 0

