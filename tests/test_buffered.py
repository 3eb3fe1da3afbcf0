"""hostcall.scan: taps of K steps delivered in one trip, in program order."""

import functools
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcall
from hostcall import host_callback as hcb

BATCH00 = ("batch", {"batch_dims": (0, 0)})


def _step(recorder):
  def step(c, x):
    hcb.id_tap(recorder.labelled("a"), (c, x))
    hcb.id_tap(recorder.labelled("b"), c * 10)
    return c + x, c
  return step


@pytest.mark.parametrize("steps,every", [(7, 3), (6, 3), (2, 8), (5, 1)])
def test_same_taps_same_order_same_results_as_lax_scan(recorder, steps,
                                                        every):
  xs = jnp.arange(1.0, steps + 1)
  expected_out = jax.jit(lambda xs: lax.scan(_step(recorder), 0.0, xs))(xs)
  hostcall.barrier()
  expected = list(recorder.values)
  recorder.calls.clear()
  out = jax.jit(lambda xs: hostcall.scan(_step(recorder), 0.0, xs,
                                         every=every))(xs)
  jax.effects_barrier()  # delivered before the computation ends
  assert recorder.values == expected
  for a, b in zip(jax.tree_util.tree_leaves(out),
                  jax.tree_util.tree_leaves(expected_out)):
    np.testing.assert_array_equal(a, b)


def test_host_calls_are_one_per_chunk():
  flushes = []
  original = hostcall._apps.loops.buffering.FlushTarget.deliver

  def counting(self, flat_args, context):
    flushes.append(int(flat_args[-1]))
    return original(self, flat_args, context)

  hostcall._apps.loops.buffering.FlushTarget.deliver = counting
  try:
    seen = []
    jax.jit(lambda: hostcall.scan(lambda c, _: (hcb.id_tap(
        lambda v, t: seen.append(int(v)), c), c + 1)[1:] + (None,), 0,
        length=10, every=4))()
    hostcall.barrier()
  finally:
    hostcall._apps.loops.buffering.FlushTarget.deliver = original
  assert flushes == [4, 4, 2]
  assert seen == list(range(10))


def test_reverse_and_no_xs(recorder):
  def step(c, x):
    hcb.id_tap(recorder, x)
    return c + x, c
  out = hostcall.scan(step, 0, jnp.arange(5), reverse=True, every=2)
  ref = lax.scan(step, 0, jnp.arange(5), reverse=True)
  hostcall.barrier()
  assert recorder.values == [4, 3, 2, 1, 0] * 2
  np.testing.assert_array_equal(out[1], ref[1])


def test_vmap_gives_taps_the_whole_batch(recorder):
  xs = jnp.arange(6.0).reshape(2, 3)
  jax.vmap(lambda xs: hostcall.scan(_step(recorder), 0.0, xs, every=2))(xs)
  hostcall.barrier()
  a_values = [v[1] for v in recorder.values if v[0] == "a"]
  assert a_values == [([0.0, 0.0], [0.0, 3.0]), ([0.0, 3.0], [1.0, 4.0]),
                      ([1.0, 7.0], [2.0, 5.0])]
  for (label, _), transforms in zip(recorder.values, recorder.transforms):
    assert transforms == ((BATCH00,) if label == "a" else
                          (("batch", {"batch_dims": (0,)}),))


@pytest.mark.parametrize("jit", [jax.jit, hostcall.jit],
                         ids=["jax.jit", "hostcall.jit"])
def test_a_vmap_of_no_lane_taps_empty_batches_as_lax_scan(recorder, jit):
  # A chunk's flush learns its steps from its buffers where the count,
  # broadcast to the lanes, has none.
  xs = jnp.zeros((0, 5))
  results = {}
  for name, loop in (("lax", lax.scan),
                     ("hostcall", functools.partial(hostcall.scan, every=2))):
    recorder.calls.clear()
    out = jit(jax.vmap(lambda xs: loop(_step(recorder), 0.0, xs)))(xs)
    hostcall.barrier()
    results[name] = (jax.tree_util.tree_map(np.shape, out),
                     [(label, jax.tree_util.tree_map(np.shape, value),
                       transforms)
                      for (label, value), transforms, _ in recorder.calls])
  assert results["hostcall"] == results["lax"]
  assert results["lax"][0] == ((0,), (0, 5))
  batch = (("batch", {"batch_dims": (0,)}),)
  assert results["lax"][1] == [("a", ((0,), (0,)), (BATCH00,)),
                               ("b", (0,), batch)] * 5


def test_grad_taps_primal_values_once(recorder):
  def step(c, x):
    hcb.id_tap(recorder, c)
    return c * x, None
  g = jax.grad(lambda c: hostcall.scan(step, c, jnp.array([2.0, 3.0]),
                                       every=4)[0])(1.0)
  hostcall.barrier()
  assert float(g) == 6.0
  assert recorder.values == [1.0, 2.0]


def test_modern_flavours_and_async_flush():
  seen = []

  @jax.jit
  @hostcall.delivery("async")
  def f(xs):
    def step(c, x):
      hostcall.debug_callback(lambda v: seen.append(("debug", int(v))), x)
      hostcall.io_callback(lambda v: seen.append(("io", int(v))), None, x,
                           ordered=True)
      return c, None
    return hostcall.scan(step, 0, xs, every=2)

  f(jnp.arange(3))
  hostcall.barrier()
  assert seen == [(k, i) for i in range(3) for k in ("debug", "io")]


def test_a_body_with_a_call_in_its_control_flow_keeps_lax_scans_order(
    recorder):
  # A tap inside the body's cond runs where it is, so the body's other taps
  # are not buffered either: the host sees lax.scan's order.
  def step(c, _):
    lax.cond(c > 0, lambda: hcb.id_tap(recorder.labelled("cond"), c),
             lambda: c)
    hcb.id_tap(recorder.labelled("top"), c)
    return c + 1, None
  orders = []
  for loop in (lax.scan, lambda f, c, **kw: hostcall.scan(f, c, every=3,
                                                          **kw)):
    recorder.calls.clear()
    jax.jit(lambda: loop(step, 0, length=3))()
    hostcall.barrier()
    orders.append(list(recorder.values))
  assert orders[0] == [("top", 0), ("cond", 1), ("top", 1), ("cond", 2),
                       ("top", 2)]
  assert orders[1] == orders[0]


def test_failing_tap_in_a_chunk_does_not_stop_the_others(recorder):
  def step(c, _):
    hcb.id_tap(lambda v, t: 1 // 0 if int(v) == 1 else None, c)
    hcb.id_tap(recorder, c)
    return c + 1, None
  jax.jit(lambda: hostcall.scan(step, 0, length=3, every=3))()
  with pytest.raises(hcb.CallbackException, match="ZeroDivisionError"):
    hostcall.barrier()
  assert recorder.values == [0, 1, 2]


def test_bad_every_is_refused():
  for bad in (0, -1, 2.5, True):
    with pytest.raises(ValueError, match="every must be a positive int"):
      hostcall.scan(lambda c, x: (c, x), 0, jnp.arange(2), every=bad)
  with pytest.raises(ValueError, match="needs xs or length"):
    hostcall.scan(lambda c, x: (c, x), 0)


def test_inside_while_and_cond(recorder):
  def inner(c):
    def step(a, _):
      hcb.id_tap(recorder, a)
      return a + 1, None
    return hostcall.scan(step, c, length=2, every=2)[0]

  out = jax.jit(lambda: lax.while_loop(lambda c: c < 4, inner, 0))()
  jax.jit(lambda p: lax.cond(p, inner, lambda c: c, 10))(True)
  hostcall.barrier()
  assert int(out) == 4
  assert recorder.values == [0, 1, 2, 3, 10, 11]


def test_constant_operands_are_buffered_too(recorder):
  def step(c, _):
    hcb.id_tap(recorder, (c, 7.0))
    return c + 1, None
  jax.jit(lambda: hostcall.scan(step, 0, length=3, every=2))()
  hostcall.barrier()
  assert recorder.values == [(0, 7.0), (1, 7.0), (2, 7.0)]


def test_zero_steps_as_lax_scan(recorder):
  step = lambda c, x: (hcb.id_tap(recorder, c) + x, c * 2)
  carry, ys = hostcall.scan(step, 1.0, jnp.zeros(0), every=4)
  want = jax.lax.scan(step, 1.0, jnp.zeros(0))
  assert float(carry) == float(want[0]) and ys.shape == want[1].shape == (0,)
  hcb.barrier_wait()
  assert recorder.calls == []


@pytest.mark.parametrize("scan", ["hostcall.scan", "hostcall.progress.scan"])
@pytest.mark.parametrize("xs, length", [
    (jnp.ones(10), 5), (jnp.ones(10), 13),
    ([jnp.ones(10), jnp.ones(12)], None)])
def test_what_lax_scan_refuses_is_refused_in_its_words(scan, xs, length):
  run = {"hostcall.scan": hostcall.scan,
         "hostcall.progress.scan": functools.partial(
             hostcall.progress.scan, file=io.StringIO())}[scan]
  body = lambda c, x: (c, None)  # noqa: E731
  with pytest.raises(ValueError) as expected:
    jax.lax.scan(body, 0.0, xs, length=length)
  with pytest.raises(ValueError) as got:
    run(body, 0.0, xs, length=length)
  assert str(got.value) == str(expected.value)


def test_hostcall_scan_takes_only_what_users_need():
  # The chunked loops' hooks are hostcall's own (scan.chunked_scan).
  import inspect
  assert list(inspect.signature(hostcall.scan).parameters) == [
      "f", "init", "xs", "length", "reverse", "unroll", "every"]
  with pytest.raises(TypeError, match="after_chunk"):
    hostcall.scan(lambda c, _: (c, None), 0, length=2,
                  after_chunk=lambda c, ys: None)


@pytest.mark.parametrize("every", [1, 2, 5])
@pytest.mark.parametrize("loop", ["hostcall.scan", "progress.scan"])
def test_a_tap_without_operands_runs_once_a_step_as_under_lax_scan(
    loop, every):
  # It buffers no value: its chunk's flush was left out, and the calls
  # with it (found by issue 54's review).
  import hostcall.progress
  seen = []

  def body(c, x):
    hostcall.debug_callback(lambda: seen.append("tick"))
    hostcall.debug_callback(lambda v: seen.append(int(v)), x)
    return c + x, None
  jax.jit(lambda: jax.lax.scan(body, 0, jnp.arange(5)))()
  hostcall.barrier()
  expected, seen[:] = list(seen), []
  scan = {"hostcall.scan": functools.partial(hostcall.scan, every=every),
          "progress.scan": functools.partial(hostcall.progress.scan,
                                             every=every, disable=True)}[loop]
  jax.jit(lambda: scan(body, 0, jnp.arange(5)))()
  hostcall.barrier()
  assert expected == ["tick", 0, "tick", 1, "tick", 2, "tick", 3, "tick", 4]
  assert seen == expected
