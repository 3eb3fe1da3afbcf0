"""Asynchronous delivery: order, completeness, back-pressure, errors, exit."""

import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcall
from hostcall import host_callback as hcb
from hostcall._runtime import tap_queue as asynchronous
from tests.helpers import wait_for

BATCH0 = ("batch", {"batch_dims": (0,)})


def test_the_device_queues_through_the_native_handler_unless_told_not_to():
  # One queue, the native one; the device reaches it through the FFI
  # handler, or through JAX's callbacks with HOSTCALL_NATIVE=0 (a platform
  # without the handler; tested on its own below).
  from hostcall._runtime import tap_queue, native_queue
  handlers = os.environ.get("HOSTCALL_NATIVE", "1") != "0"
  assert hostcall.queue_stats()["native"] is handlers
  assert type(tap_queue.consumer.start()) is native_queue.NativeQueue


def test_order_and_completeness_with_several_taps_a_step(recorder):
  def step(c, _):
    hcb.id_tap(recorder, (c, 0), delivery="async")
    hcb.id_tap(recorder, (c, 1), delivery="async")
    return c + 1, None
  jax.jit(lambda: lax.scan(step, 0, None, length=500))()
  hostcall.barrier()
  assert recorder.values == [(i, k) for i in range(500) for k in range(2)]


def test_device_does_not_wait_for_the_host_function():
  release, entered = threading.Event(), threading.Event()
  seen = []

  def slow(value, transforms):
    entered.set()
    release.wait(60)
    seen.append(int(value))

  f = jax.jit(lambda x: lax.fori_loop(
      0, 3, lambda i, c: hcb.id_tap(slow, c + i, delivery="async"), x))
  out = f(0).block_until_ready()  # finishes while the host function waits
  assert int(out) == 3
  entered.wait(60)
  assert seen == []
  release.set()
  hostcall.barrier()
  assert seen == [0, 1, 3]


def test_back_pressure_blocks_the_device_and_loses_nothing():
  hostcall.set_queue_capacity(1 << 16)
  try:
    release = threading.Event()
    seen = []

    def consumer(value, transforms):
      release.wait(60)
      seen.append(int(value[0]))

    f = jax.jit(lambda: lax.fori_loop(0, 200, lambda i, c: (hcb.id_tap(
        consumer, jnp.full((1024,), i), delivery="async"), c)[1], 0))
    waits_before = hostcall.queue_stats()["producer_waits"]
    worker = threading.Thread(target=lambda: f().block_until_ready())
    worker.start()
    try:
      wait_for(lambda: hostcall.queue_stats()["producer_waits"] >
                waits_before)
      assert worker.is_alive()  # the device is held back by the full queue
      assert hostcall.queue_stats()["queued_bytes"] <= 1 << 16
    finally:
      release.set()  # a failed assertion must not leave the consumer held
    worker.join(60)
    hostcall.barrier()
    assert seen == list(range(200))
  finally:
    hostcall.set_queue_capacity(asynchronous.DEFAULT_CAPACITY)


def test_exceptions_surface_at_the_barrier_and_later_taps_run(recorder):
  def fails(value, transforms):
    raise ValueError(f"async failure at {value}")

  f = jax.jit(lambda x: hcb.id_tap(recorder, hcb.id_tap(
      fails, x, delivery="async"), delivery="async"))
  f(1.0)
  f(2.0)
  with pytest.raises(hcb.CallbackException, match="async failure at 2.0"):
    hostcall.barrier()
  assert recorder.values == [1.0, 2.0]
  hostcall.barrier()


def test_context_manager_sets_the_delivery(recorder):
  with hostcall.delivery("async"):
    f = jax.jit(lambda x: hcb.id_tap(recorder, x))
    before = hostcall.queue_stats()["pushed"]
    f(1.0)
  hostcall.barrier()
  assert hostcall.queue_stats()["pushed"] == before + 1
  assert recorder.values == [1.0]
  with pytest.raises(ValueError, match="delivery must be one of"):
    with hostcall.delivery("later"):
      pass


@pytest.mark.parametrize("transform,expected", [
    (lambda f: jax.vmap(f), ([[0.0, 1.0, 2.0]], [(BATCH0,)])),
    (lambda f: jax.grad(lambda x: f(x).sum()), ([[0.0, 1.0, 2.0]], [()])),
    (lambda f: jax.jit(jax.vmap(jax.grad(lambda x: f(x) * 2))),
     ([[0.0, 1.0, 2.0]], [(BATCH0,)])),
])
def test_transforms(recorder, transform, expected):
  with hostcall.delivery("async"):
    transform(lambda x: hcb.id_tap(recorder, x) * 2)(jnp.arange(3.0))
  hostcall.barrier()
  assert (recorder.values, recorder.transforms) == expected


def test_while_with_batched_predicate_and_cond(recorder):
  def f(limit):
    def body(c):
      lax.cond(c % 2 == 0, lambda: hcb.id_tap(recorder.labelled("even"), c),
               lambda: hcb.id_tap(recorder.labelled("odd"), c))
      return c + 1
    return lax.while_loop(lambda c: c < limit, body, 0)
  with hostcall.delivery("async"):
    jax.vmap(f)(jnp.array([1, 2]))
  hostcall.barrier()
  labels = [v[0] for v in recorder.values]
  assert labels.count("even") == 2 and labels.count("odd") == 2
  assert all(v[1] in ([0, 0], [1, 1]) for v in recorder.values)


def test_debug_callback_and_io_callback_without_result():
  seen = []
  pushed = hostcall.queue_stats()["pushed"]
  with hostcall.delivery("async"):
    jax.jit(lambda x: (hostcall.debug_callback(lambda v: seen.append(
        ("debug", int(v))), x), hostcall.io_callback(lambda v: seen.append(
            ("io", int(v))), None, x, ordered=True), x)[2])(7)
  hostcall.barrier()
  assert sorted(seen) == [("debug", 7), ("io", 7)]
  assert hostcall.queue_stats()["pushed"] == pushed + 2  # both were queued


def test_calls_with_results_stay_synchronous():
  with hostcall.delivery("async"):
    out = jax.jit(lambda x: hcb.call(lambda v: v + 1, x, result_shape=x))(1.0)
  assert float(out) == 2.0


def test_dtypes_round_trip_through_the_native_queue(recorder):
  values = (jnp.array([True, False]), jnp.int8(-3), jnp.uint16(7),
            jnp.arange(3, dtype=jnp.int32), jnp.float16(1.5),
            jnp.array([1.25], jnp.bfloat16), jnp.complex64(1 + 2j),
            jnp.zeros((2, 0, 3)))
  jax.jit(lambda v: hcb.id_tap(recorder, v, delivery="async"))(values)
  hostcall.barrier()
  (got, _, _), = recorder.calls
  for a, b in zip(got, values):
    assert a.dtype == np.asarray(b).dtype and a.shape == np.shape(b)
    np.testing.assert_array_equal(a, np.asarray(b))


_SCRIPT = textwrap.dedent("""
    import sys, jax
    from jax import lax
    from hostcall import host_callback as hcb
    out = open(sys.argv[1], "w")
    def write(v, transforms):
      out.write(f"{int(v)}\\n"); out.flush()
    f = jax.jit(lambda: lax.fori_loop(
        0, 1000, lambda i, c: (hcb.id_tap(write, i, delivery="async"), c)[1],
        0))
    f()
    # no barrier: the exit hook must deliver everything queued
""")


@pytest.mark.parametrize("native", ["1", "0"])
def test_pending_taps_are_delivered_at_exit(tmp_path, native):
  script, output = tmp_path / "run.py", tmp_path / "taps.txt"
  script.write_text(_SCRIPT)
  env = dict(os.environ, HOSTCALL_NATIVE=native)
  proc = subprocess.run([sys.executable, str(script), str(output)], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert output.read_text().split() == [str(i) for i in range(1000)]


def test_taps_pushed_by_python_callbacks_keep_order(tmp_path):
  # HOSTCALL_NATIVE=0: the route of a platform without the FFI handler.
  script = tmp_path / "pushed.py"
  script.write_text(textwrap.dedent("""
      import jax, hostcall
      from jax import lax
      from hostcall import host_callback as hcb
      seen = []
      jax.jit(lambda: lax.fori_loop(0, 300, lambda i, c: (hcb.id_tap(
          lambda v, t: seen.append(int(v)), i, delivery="async"), c)[1], 0))()
      hostcall.barrier()
      stats = hostcall.queue_stats()
      assert seen == list(range(300)), seen[:10]
      assert stats["native"] is False and stats["delivered"] == 300, stats
      print("ok")
  """))
  env = dict(os.environ, HOSTCALL_NATIVE="0")
  proc = subprocess.run([sys.executable, str(script)], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
