"""Under hostcall.jit (its queued route, one device) a steered loop's open
and finish are the device's own (control.open_here, control.finish_here):
the program has no live host call, and the host's open, queued behind the
device's, adopts the handle the device made."""

import io
import re
import signal
import threading
import time

import jax
import jax.numpy as jnp
import pytest

import hostcall
from hostcall import control
from hostcall._apps.control import controls
from hostcall._apps.loops import invocations as loops
from hostcall._core.context import make_context
from hostcall.host_callback import CallbackException


def _has_host_callbacks(function, *args) -> bool:
  """Whether the program hostcall.jit runs for ``function`` holds a JAX
  host callback (which sends it down JAX's Python dispatch path)."""
  program = hostcall.jit(function)._hostcall_jitted._active
  return program.lower(*args).compile()._executable.unsafe_call \
      .has_host_callbacks


def _last_render(stream: io.StringIO, desc: str) -> str:
  return [r.strip() for r in re.split(r"[\r\n]", stream.getvalue())
          if r.strip().startswith(desc + ":")][-1]


class _Opened(loops.Listener):
  """Records each steered invocation's handle as its host open adopts it,
  with the stop state's group and the host side's."""

  def __init__(self):
    self.seen = []

  def on_opened(self, invocation):
    if invocation.stop is not None:
      group = controls._group_of[invocation.handle].id
      self.seen.append((invocation.handle,
                        controls.states.group_of(invocation.handle), group))


@pytest.fixture
def opened():
  listener = _Opened()
  loops.invocations.listen(listener)
  yield listener.seen
  loops.invocations._listeners.remove(listener)


def _scan(**options):
  return lambda x: hostcall.progress.scan(
      lambda c, _: (c + x, None), 0, length=400, every=10, disable=True,
      **options)


def test_the_steered_loops_program_has_no_live_host_call(queued):
  def steered_while(x):
    return hostcall.progress.while_loop(
        lambda c: c < 100, lambda c: c + x, 0, total=100, every=10,
        time_limit=3600.0, file=io.StringIO())

  def paced_while(x):  # a host pace reads the handle: the open stays live
    return hostcall.progress.while_loop(
        lambda c: c < 100, lambda c: c + x, 0, time_limit=3600.0,
        file=io.StringIO())

  assert not _has_host_callbacks(steered_while, 1)
  assert not _has_host_callbacks(_scan(time_limit=3600.0), 1)
  assert not _has_host_callbacks(lambda x: control.while_loop(
      lambda c: c < 100, lambda c: c + x, 0, every=10, interruptible=True), 1)
  assert _has_host_callbacks(paced_while, 1)
  # A predicate's checks wait for the host: its open stays live too.
  assert _has_host_callbacks(_scan(stop_when=lambda s: False), 1)
  hostcall.barrier()


def test_the_host_adopts_the_handles_the_device_made(queued, opened):
  # Two threads run steered programs at once: every invocation has a
  # handle of its own, from the device's range, opened in the stop state's
  # group that the host side adopted.
  run = hostcall.jit(_scan(time_limit=3600.0))
  results = []

  def runs():
    for _ in range(4):
      results.append(run(1))

  threads = [threading.Thread(target=runs) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  hostcall.barrier()
  assert [int(r.value[0]) for r in results] == [400] * 8
  handles = [handle for handle, _, _ in opened]
  assert len(handles) == len(set(handles)) == 8
  assert all(h >= loops.DEVICE_HANDLES for h in handles)
  assert all(native == group for _, native, group in opened)
  # Under jax.jit the open stays the host's: a handle of the registry's.
  jax.jit(_scan(time_limit=3600.0))(1)
  hostcall.barrier()
  assert opened[-1][0] < loops.DEVICE_HANDLES
  assert [controls.states.group_of(h) for h in handles] == [None] * 8


def test_a_predicate_stops_the_loop_and_its_bar_closes_stopped(queued):
  out = io.StringIO()
  seen = []
  result = hostcall.jit(lambda x: hostcall.progress.scan(
      lambda c, _: (c + x, None), 0, length=400, every=10, file=out,
      desc="halt", stop_when=lambda s: seen.append(s.steps) or s.steps >= 100
  ))(1)
  hostcall.barrier()
  # Within one check of its answer: a check waits for the predicate to
  # have seen the chunk before its own.
  assert bool(result.stopped) and control.reason_name(result.reason) == (
      "stop_when")
  assert int(result.steps) in (100, 110)
  assert int(result.value[0]) == int(result.steps)
  assert seen == list(range(10, int(result.steps) + 1, 10))
  assert "stopped" in _last_render(out, "halt")


def test_a_time_limit_stops_the_loop_at_a_check(queued):
  # Its clock starts at the device's open.
  start = time.monotonic()
  result = hostcall.jit(lambda: control.while_loop(
      lambda c: c < 2**31 - 2, lambda c: c + 1, 0, every=10_000,
      time_limit=0.05))()
  jax.block_until_ready(result)
  elapsed = time.monotonic() - start
  hostcall.barrier()
  assert bool(result.stopped) and control.reason_name(result.reason) == (
      "time_limit")
  steps = int(result.steps)
  assert steps == int(result.value) and steps % 10_000 == 0
  assert 0 < steps < 2**31 - 2 and elapsed >= 0.05


def _endless(**options):
  """A steered loop that runs until stopped (by its time limit of 30 s
  at the latest, where the test does not stop it); returns its steps."""
  def body(c):
    i, x = c
    return i + 1, jnp.sin(x) * 0.5 + 1.0
  return hostcall.jit(lambda: control.while_loop(
      lambda c: c[0] < 2**31 - 2, body, (0, jnp.zeros(64)), every=1000,
      time_limit=30.0, **options))


def _when_open(act):
  """Runs ``act(handle)`` in a thread once the host has adopted a handle
  the device made (a steered loop's queued open was delivered); gives up
  after 20 s (the test then fails on what ``act`` did not do)."""
  def watch():
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
      handles = [h for h in list(controls._open)
                 if h >= loops.DEVICE_HANDLES]
      if handles:
        return act(handles[0])
      threading.Event().wait(0.001)
  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return thread


def test_ctrl_c_stops_an_interruptible_loop_the_device_opened(queued):
  # SIGINT while the loop runs is taken by the stop states' handler,
  # installed by the device's open; the loop stops at a following check
  # and Ctrl-C is Python's again once the call returns.
  taken = []

  def interrupt(handle):
    taken.append(controls.sigint_installed()
                 and controls.states.running(handle))
    if taken[-1]:  # (else the SIGINT would interrupt the test)
      signal.raise_signal(signal.SIGINT)

  thread = _when_open(interrupt)
  result = _endless(interruptible=True)()
  jax.block_until_ready(result)
  thread.join()
  assert not controls.sigint_installed()
  hostcall.barrier()
  assert taken == [True]
  assert bool(result.stopped) and control.reason_name(result.reason) == (
      "interrupted")
  steps = int(result.steps)
  assert steps == int(result.value[0]) and steps % 1000 == 0


def test_a_failure_the_loop_contains_reaches_the_barrier_as_its_own(queued):
  # The loop stops at its next check; the host's finish, queued where the
  # device asks for it, raises the failure: the barrier reports it, as
  # any host function's failure under hostcall.jit.
  device = jax.devices()[0]
  contained = []
  thread = _when_open(lambda handle: contained.append(
      controls.take(make_context((), device), ValueError("boom"))))
  result = _endless()()
  jax.block_until_ready(result)
  thread.join()
  with pytest.raises(CallbackException, match="boom") as caught:
    hostcall.barrier()
  assert contained == [True]
  assert isinstance(caught.value.__cause__, ValueError)
  assert bool(result.stopped) and control.reason_name(result.reason) == (
      "failed")
  assert int(result.steps) % 1000 == 0
  assert not controls.failing


def test_a_failing_predicate_stops_the_loop_and_reaches_the_barrier(queued):
  def fails_at_30(status):
    if status.steps == 30:
      raise KeyError("predicate")
    return False

  result = hostcall.jit(_scan(stop_when=fails_at_30))(1)
  with pytest.raises(CallbackException, match="predicate") as caught:
    hostcall.barrier()
  assert isinstance(caught.value.__cause__, KeyError)
  assert bool(result.stopped) and 30 <= int(result.steps) <= 50


def test_a_host_open_that_fails_forgets_the_devices_stop_state(
    queued, opened):
  # The bar cannot draw: the host's open fails on the delivery thread
  # (reported by the barrier), the loop runs to its end, and the stop
  # state its device opened is closed (else it stayed for ever).
  run = lambda bar_format: hostcall.jit(lambda x: hostcall.progress.scan(
      lambda c, _: (c + x, None), 0, length=40, every=5, file=io.StringIO(),
      bar_format=bar_format, time_limit=3600.0))(1)
  result = run("{nonexistent}")
  with pytest.raises(CallbackException, match="nonexistent"):
    hostcall.barrier()
  assert (int(result.value[0]), bool(result.stopped)) == (40, False)
  run(None)
  hostcall.barrier()
  ((handle, _, _),) = opened  # the next the device made
  assert controls.states.group_of(handle - 1) is None
  assert handle - 1 >= loops.DEVICE_HANDLES
