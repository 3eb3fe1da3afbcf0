"""The gather window of asynchronous delivery (``set_gather_window``): taps
that trickle in are delivered together, and nothing anyone waits for waits
out the window."""

import io
import math
import threading
import time

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import hostcall
from hostcall import host_callback as hcb
from hostcall._runtime import tap_queue as asynchronous, native_queue
from tests.helpers import wait_for

# Longer than any test's guard: a rule that failed to end the window would
# show as a hang caught by the guard, not as a slow pass.
FOREVER = 3600.0


def _in_thread(run, guard=60.0):
  """Runs ``run()`` in a thread; fails if it has not returned after
  ``guard`` seconds (a hang), else returns its result."""
  out, errors = [], []

  def target():
    try:
      out.append(run())
    except BaseException as exc:  # noqa: BLE001 - re-raised below
      errors.append(exc)

  worker = threading.Thread(target=target, daemon=True)
  worker.start()
  worker.join(guard)
  assert not worker.is_alive(), "still waiting: the window was not ended"
  if errors:
    raise errors[0]
  return out[0]


def _tapping_loop(recorder, steps, size=1):
  return jax.jit(lambda: lax.fori_loop(0, steps, lambda i, c: (hcb.id_tap(
      recorder, jnp.full((size,), i), delivery="async"), c)[1], 0))


def test_taps_that_trickle_in_are_delivered_in_one_trip(window, recorder):
  window(FOREVER)
  trips = hostcall.queue_stats()["trips"]
  _tapping_loop(recorder, 200)().block_until_ready()
  _in_thread(hostcall.barrier)  # the barrier ends the window
  assert [v[0] for v in recorder.values] == list(range(200))
  assert hostcall.queue_stats()["trips"] == trips + 1


def test_a_full_queue_ends_the_window(window, recorder):
  window(FOREVER)
  hostcall.set_queue_capacity(1 << 16)
  try:
    # 400 KiB through a 64 KiB queue: the device goes on only as the
    # delivery thread takes what the queue holds, without a barrier.
    _in_thread(lambda: _tapping_loop(recorder, 400, size=256)()
               .block_until_ready())
    hostcall.barrier()
  finally:
    hostcall.set_queue_capacity(asynchronous.DEFAULT_CAPACITY)
  assert [v[0] for v in recorder.values] == list(range(400))


def test_a_full_batch_ends_the_window(window, recorder):
  window(FOREVER)
  trips = hostcall.queue_stats()["trips"]
  _tapping_loop(recorder, 3 * native_queue.NativeQueue.BATCH + 5)()
  # Whole batches go without a barrier; only the last five wait for one.
  wait_for(lambda: len(recorder.calls) >= 3 * native_queue.NativeQueue.BATCH)
  assert len(recorder.calls) == 3 * native_queue.NativeQueue.BATCH
  hostcall.barrier()
  assert [v[0] for v in recorder.values] == list(
      range(3 * native_queue.NativeQueue.BATCH + 5))
  assert hostcall.queue_stats()["trips"] == trips + 4


def test_a_steered_loop_with_a_predicate_does_not_wait_out_the_window(
    window):
  window(FOREVER)
  seen = []

  def stop_when(status):
    seen.append(status.steps)
    return status.steps >= 300

  # Each check waits for the predicate to see the chunk before: a tick
  # left gathering would hold every check.
  run = jax.jit(lambda x: hostcall.progress.scan(
      lambda c, _: (c * 1.0001, None), x, length=2000, every=100,
      stop_when=stop_when, file=io.StringIO()))
  out = _in_thread(lambda: run(jnp.float32(1.0)))
  hostcall.barrier()
  assert bool(out.stopped) and int(out.steps) in (300, 400)
  assert seen[:3] == [100, 200, 300]


def test_flush_soon_delivers_what_is_queued_and_later_taps_gather(
    window, recorder):
  # A barrier asks for it first, so that the delivery thread wakes while
  # running computations end: it takes what is queued then, in one
  # trip, and what comes after it gathers again.
  window(FOREVER)
  trips = hostcall.queue_stats()["trips"]
  _tapping_loop(recorder, 50)().block_until_ready()
  asynchronous.consumer.flush_soon()
  wait_for(lambda: len(recorder.calls) == 50)
  assert hostcall.queue_stats()["trips"] == trips + 1
  jax.jit(lambda: hcb.id_tap(recorder, jnp.full((1,), 50),
                             delivery="async"))().block_until_ready()
  # Left gathering (the window is an hour): nothing asks for it now. The
  # next flush takes it.
  assert hostcall.queue_stats()["queued"] == 1 and len(recorder.calls) == 50
  asynchronous.consumer.flush_soon()
  wait_for(lambda: len(recorder.calls) == 51)
  hostcall.barrier()
  assert [v[0] for v in recorder.values] == list(range(51))
  assert hostcall.queue_stats()["trips"] == trips + 2


def test_taps_are_delivered_in_order_with_no_window(window, recorder):
  window(0.0)
  _tapping_loop(recorder, 300)()
  hostcall.barrier()
  assert [v[0] for v in recorder.values] == list(range(300))


@pytest.mark.parametrize("given", [-0.001, 1.5, math.nan, math.inf, "5ms",
                                   True, [0.005]])
def test_the_window_is_seconds_from_0_to_1(given):
  with pytest.raises(ValueError, match=r"the gather window is a number of "
                     r"seconds from 0 to 1\.0; got .*\. The default is "
                     r"0\.01 \(0\.002 while the main thread waits\): "
                     r"set_gather_window\(None\)\."):
    hostcall.set_gather_window(given)
  assert asynchronous.consumer.gather == asynchronous.DEFAULT_GATHER


def test_the_window_takes_any_real_number_of_seconds():
  import numpy as np
  try:
    for given in (0, 1, 0.02, np.float32(0.25), np.int64(0)):
      hostcall.set_gather_window(given)
      assert asynchronous.consumer.gather == float(given)
  finally:
    hostcall.set_gather_window(None)


class _Load:
  def __init__(self, busy):
    self.busy = lambda: busy


@pytest.mark.parametrize("busy", [True, False])
def test_the_default_window_is_shorter_while_the_main_thread_waits(
    busy, monkeypatch):
  consumer = asynchronous.consumer
  monkeypatch.setattr(consumer, "_main_thread", _Load(busy))
  assert consumer._window() == (asynchronous.DEFAULT_GATHER if busy
                                else asynchronous.IDLE_GATHER)
  try:  # a window given holds whatever the main thread does
    for given in (0.05, 0.0, 0.001):
      hostcall.set_gather_window(given)
      assert consumer._window() == given
  finally:
    hostcall.set_gather_window(None)  # the default again
  assert (consumer.gather, consumer.idle_gather) == (
      asynchronous.DEFAULT_GATHER, asynchronous.IDLE_GATHER)
  assert consumer._window() == (asynchronous.DEFAULT_GATHER if busy
                                else asynchronous.IDLE_GATHER)


def test_the_main_threads_load_tells_a_busy_thread_from_a_waiting_one():
  load = asynchronous._MainThreadLoad()
  # (A loaded machine gives the spinning thread less than its core: any
  # share of it tells it from a waiting one, whose CPU time stands still.)
  load.BUSY = 0.02
  told, spun, waited = [], threading.Event(), threading.Event()

  def spin(seconds):  # this thread's own time passes, the clock's too
    end = time.thread_time() + seconds
    while time.thread_time() < end:
      pass

  def watch():
    load.busy()  # the first look
    spun.wait(60)  # the main thread has spun since
    told.append(load.busy())
    spin(0.05)  # the main thread waits meanwhile
    told.append(load.busy())
    waited.set()

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  spin(0.05)
  spun.set()
  assert waited.wait(60)
  watcher.join(60)
  assert told == [True, False]


class _HookFailure(BaseException):
  pass


def test_a_failing_trip_hook_is_logged_and_delivery_goes_on(recorder,
                                                             caplog):
  from hostcall._runtime import calls
  ran = []

  def failing():
    ran.append(True)
    raise _HookFailure("a trip hook")

  calls.add_round_hook(failing)
  try:
    for i in range(2):  # a trip each: the thread outlives the first
      jax.jit(lambda: hcb.id_tap(recorder, i, delivery="async"))()
      hostcall.barrier()
  finally:
    calls._round_hooks.remove(failing)
  assert [int(v) for v in recorder.values] == [0, 1]
  assert len(ran) >= 2
  assert "a delivery trip's hook failed" in caplog.text
