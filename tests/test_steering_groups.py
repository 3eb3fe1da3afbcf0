"""A steered loop's group: one invocation on this process's devices, from
its first device's open until every device of it has ended (``bars``'
release), with either stop states.

The devices of one invocation need not overlap in time: without a body
that communicates, one may finish and close before another opens (a busy
machine), and in a global view the loop's one device closes it while the
others have still to run its finish. Each must still see the same stop
decision and the same contained failure.
"""

import io

import jax
import pytest

import hostcall
from hostcall import host_callback as hcb
from hostcall._apps.control import (FAILED, STOP_WHEN, Stop, host,
                                    stop_states_library as library,
                                    states)
from hostcall._core.context import make_context
from tests.helpers import FirstCallWaits

KEY = ("site", 0)  # the invocation's (site, index)
FIRST, LATE = 3_000_001, 3_000_002  # handles no bar uses
STOP = Stop.of(False, 3600.0, None)


@pytest.fixture
def controls(monkeypatch):
  stop_states = states.StopStates(library.load())
  monkeypatch.setattr(host._loops.invocations, "group_of", lambda handle: KEY)
  made = host._Controls(stop_states)
  yield made
  for handle in (FIRST, LATE):
    made.close(handle)
  made.release(KEY)


def _registries(controls):
  return {name: len(getattr(controls, name)) for name in
          ("_groups", "_open", "_group_of", "_device_of",
           "_released_failures")}


def test_a_device_opening_after_its_peers_closed_stops_at_their_check(
    controls):
  devices = jax.devices()
  controls.open(FIRST, STOP, devices[0])
  group = controls._groups[KEY].id
  assert [controls.poll(FIRST, 1), controls.poll(FIRST, 2)] == [0, 0]
  controls.request(group, STOP_WHEN)
  assert controls.poll(FIRST, 3) == STOP_WHEN
  controls.close(FIRST)
  # Not released: the invocation may have devices still to open.
  controls.open(LATE, STOP, devices[-1])
  assert controls._groups[KEY].id == group
  assert [controls.poll(LATE, 1), controls.poll(LATE, 2),
          controls.poll(LATE, 3)] == [0, 0, STOP_WHEN]
  controls.close(LATE)
  controls.release(KEY)
  assert _registries(controls) == dict.fromkeys(_registries(controls), 0)
  # Released: the next invocation under the same key is a group of its own
  # (its stop states too), not asked to stop.
  controls.open(FIRST, STOP, devices[0])
  assert controls._groups[KEY].id != group
  assert [controls.poll(FIRST, k) for k in (1, 2, 3, 4)] == [0, 0, 0, 0]


@pytest.mark.parametrize("finished_before", [0, 1])
def test_a_finish_after_the_release_raises_the_contained_failure(
    controls, finished_before):
  # A global view: the loop's one device opens and closes it; every device
  # runs its finish, some (or all) after the close was delivered.
  device = jax.devices()[0]
  controls.open(FIRST, STOP, device)
  assert controls.take(make_context((), device), ValueError("boom"))
  assert controls.poll(FIRST, 1) == FAILED
  for _ in range(finished_before):
    with pytest.raises(ValueError, match="boom"):
      controls.finish(FIRST, FAILED)
  controls.close(FIRST)
  controls.release(KEY)
  for _ in range(3):  # one finish per device, each raises it
    with pytest.raises(ValueError, match="boom"):
      controls.finish(FIRST, FAILED)
  # Raised: the barrier has nothing more to report.
  controls.after_barrier()
  hostcall.barrier()
  assert _registries(controls) == dict.fromkeys(_registries(controls), 0)


def test_a_failure_no_finish_raised_is_reported_by_the_barrier(controls):
  device = jax.devices()[0]
  controls.open(FIRST, STOP, device)
  assert controls.take(make_context((), device), ValueError("never raised"))
  controls.close(FIRST)
  controls.release(KEY)
  hostcall.barrier()  # (this instance's hook is not the process's)
  controls.after_barrier()
  assert _registries(controls) == dict.fromkeys(_registries(controls), 0)
  with pytest.raises(hcb.CallbackException, match="never raised"):
    hostcall.barrier()
  # A finish after that raises the other process's words, not it again.
  with pytest.raises(RuntimeError, match="another process"):
    controls.finish(FIRST, FAILED)


def test_released_failures_stay_bounded(controls, monkeypatch):
  monkeypatch.setattr(controls, "KEPT_FAILURES", 4)
  device = jax.devices()[0]
  for k in range(6):
    key = ("site", k)
    monkeypatch.setattr(host._loops.invocations, "group_of",
                        lambda h, key=key: key)
    controls.open(FIRST + 10 + k, STOP, device)
    assert controls.take(make_context((), device), ValueError(f"boom {k}"))
    controls.close(FIRST + 10 + k)
    controls.release(key)
  # The two oldest were reported at once; the rest wait for their finish.
  assert len(controls._released_failures) == 4
  with pytest.raises(hcb.CallbackException, match="boom 1"):
    hostcall.barrier()
  controls.after_barrier()
  with pytest.raises(hcb.CallbackException, match="boom 5"):
    hostcall.barrier()


def test_a_failure_whose_finish_never_ran_is_raised_by_the_next_barrier():
  # The loop's host function fails (contained); before its next check,
  # JAX's own callback fails the computation: no finish ever runs. The
  # invocation is released inside the barrier (its bar closed there), and
  # that same barrier raises the contained failure, once.
  def failing(i):
    if int(i) == 30:
      raise ValueError("contained boom")

  def jaxs(i):
    if int(i) == 31:
      raise KeyError("jax's own callback")

  def run(x):
    def step(c, i):
      hostcall.debug_callback(failing, i)
      jax.debug.callback(jaxs, i)
      return c + 1.0, None
    return hostcall.progress.scan(step, x, jax.numpy.arange(300), every=50,
                                  file=io.StringIO(), time_limit=3600.0).steps

  with pytest.raises(jax.errors.JaxRuntimeError, match="jax's own callback"):
    jax.block_until_ready(jax.jit(run)(0.0))
  with pytest.raises(hcb.CallbackException, match="contained boom"):
    hostcall.barrier()
  hostcall.barrier()
  assert not host.controls._groups and not host.controls._released_failures


def test_a_handle_without_an_invocation_is_a_group_of_its_own(controls,
                                                              monkeypatch):
  # Its bar was closed before the open (progress.close_all in another
  # thread): it shares no decision, and its close releases it.
  monkeypatch.setattr(host._loops.invocations, "group_of", lambda handle: None)
  device = jax.devices()[0]
  controls.open(FIRST, STOP, device)
  controls.open(LATE, STOP, device)
  controls.request(controls._group_of[FIRST].id, STOP_WHEN)
  assert [controls.poll(FIRST, 1), controls.poll(LATE, 1)] == [STOP_WHEN, 0]
  controls.close(FIRST)
  controls.close(LATE)
  assert _registries(controls) == dict.fromkeys(_registries(controls), 0)


def test_a_loop_that_ended_on_its_device_contains_no_later_failure(
    controls):
  # hostcall.jit's device ends its steered loop itself (the native
  # finish), the host learning of it only at the close: a synchronous call
  # that fails on that device after the loop fails its own computation, as
  # after a host finish, instead of being held for a loop that is over.
  device = jax.devices()[0]
  context = make_context((), device)
  controls.open(FIRST, STOP, device)
  assert controls.take(context, ValueError("in the loop"))  # contained
  controls.close(FIRST)
  controls.release(KEY)
  hostcall.barrier()
  controls.after_barrier()
  with pytest.raises(hcb.CallbackException, match="in the loop"):
    hostcall.barrier()
  controls.open(LATE, STOP, device)
  controls.states.end(LATE)  # what the device's finish does
  assert not controls.take(context, ValueError("after the loop"))
  assert not controls.failing


@pytest.mark.parametrize("first", ["failure", "finish"])
def test_a_failure_and_the_devices_own_finish_are_one_or_the_other(
    controls, first):
  # hostcall.jit's finish (control.finish_here) reads the stop states
  # only: a failure contained before it makes it ask the host (whose
  # finish raises it); one after it is not the loop's (it fails its own
  # computation). Never held with nobody to raise it.
  from hostcall._apps import control
  device = jax.devices()[0]
  context = make_context((), device)
  controls.open(FIRST, STOP, device)
  finish_here = jax.jit(control.finish_here)
  if first == "failure":
    assert controls.take(context, ValueError("boom"))
    assert int(finish_here(FIRST, 0)) == 1
    with pytest.raises(ValueError, match="boom"):
      controls.finish(FIRST, 0)
  else:
    assert int(finish_here(FIRST, 0)) == 0
    assert not controls.take(context, ValueError("boom"))
  assert not controls.failing


@pytest.mark.parametrize("jit", [jax.jit, hostcall.jit],
                         ids=["jax.jit", "hostcall.jit"])
def test_another_threads_failure_on_the_device_is_not_contained_by_a_loop(
    jit):
  # Thread B's steered loop waits in a host function when thread A's own
  # computation (no loop) fails in a hostcall host function on the same
  # CPU device: A's call fails with A's error, as outside any loop; B's
  # loop runs to its end, never stopped and raising nothing.
  import threading

  import jax.numpy as jnp
  from hostcall import control

  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  wait_once = FirstCallWaits()
  entered, release = wait_once.entered, wait_once.release

  def boom(x):
    raise ValueError("A's failure")

  run_b = jit(lambda x: control.while_loop(
      lambda c: c < 20, lambda c: jax.pure_callback(wait_once, scalar, c + 1),
      x, stop_when=lambda status: False, every=1))
  run_a = jit(lambda x: hostcall.pure_callback(boom, scalar, x))
  results = []
  worker = threading.Thread(target=lambda: results.append(run_b(jnp.int32(0))))
  worker.start()
  try:
    assert entered.wait(60)
    with pytest.raises(Exception, match="A's failure"):
      jax.block_until_ready(run_a(jnp.int32(7)))
  finally:
    release.set()
    worker.join()
  hostcall.barrier()
  assert [(int(r.value), bool(r.stopped)) for r in results] == [(20, False)]
