"""Steered loops on several devices whose host function fails on one.

A steered loop's devices stop after the same check. A host function that
raises on one device must fail the call on every device, as the same loop
without steering fails, and never leave the other devices waiting (in the
reduction the check adds across processes, or in the body's own
collectives): the failure is contained, every device stops at the next
check, and the loop's call raises it.
"""

import io
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hostcall
from hostcall import control, progress

FAILING_STEP, STEPS = 300, 3_000


class Host:
  """A host function that raises on one device at one step, recording which
  (device, step) pairs reached it."""

  def __init__(self, failing_device):
    self.failing_device = failing_device
    self.seen = []

  def __call__(self, step):
    device = hostcall.call_context().device.id
    self.seen.append((device, int(step)))
    if device == self.failing_device and int(step) == FAILING_STEP:
      raise ValueError(f"boom on device {device}")
    return np.int32(0)

  def steps_of(self, device):
    return [s for d, s in self.seen if d == device]


def _bodies(host, flavour, communicate):
  def tap(step):
    if flavour == "debug_callback":
      hostcall.debug_callback(host, step)
      return 0
    return hostcall.pure_callback(
        host, jax.ShapeDtypeStruct((), jnp.int32), step)

  def mix(c, x):
    # The psum reads the carry: one of x alone would be hoisted out of the
    # loop, and the devices would not run in step.
    return c + x + (jax.lax.psum(c, "d") * 1e-9 if communicate else 0)

  return tap, mix


_LOOPS = ["progress.scan", "progress.while_loop", "control.while_loop"]


def _steered(loop, host, flavour, communicate):
  tap, mix = _bodies(host, flavour, communicate)

  def run(x):
    if loop == "progress.scan":
      def step(c, i):
        return mix(c, x) + tap(i), None
      out = progress.scan(step, x * 0, jnp.arange(STEPS), every=50,
                          file=io.StringIO(), time_limit=3600.0)
      return out.value[0]
    if loop == "progress.while_loop":
      out = progress.while_loop(
          lambda s: s[0] < STEPS,
          lambda s: (s[0] + 1, mix(s[1], x) + tap(s[0])), (0, x * 0),
          every=50, file=io.StringIO(),
          stop_when=lambda status: False)
      return out.value[1]
    out = control.while_loop(
        lambda s: s[0] < STEPS,
        lambda s: (s[0] + 1, mix(s[1], x) + tap(s[0])), (0, x * 0),
        every=50, interruptible=True)  # checks at the same steps everywhere
    return out.value[1]
  return run


def _fails_with_boom(f, *args):
  with pytest.raises(jax.errors.JaxRuntimeError, match="boom on device"):
    jax.block_until_ready(f(*args))
  # Nothing left behind: no postponed failure, and the failed computation
  # ends the barrier's wait (JAX's own effects barrier raises its error
  # again at every call once a computation on several devices failed).
  hostcall.barrier()
  hostcall.barrier()


@pytest.mark.parametrize("communicate", [False, True])
@pytest.mark.parametrize("flavour", ["debug_callback", "pure_callback"])
@pytest.mark.parametrize("loop", _LOOPS)
def test_a_failure_on_one_device_fails_the_call_under_shard_map(
    loop, flavour, communicate):
  mesh = Mesh(np.array(jax.devices()), ("d",))
  host = Host(failing_device=1)
  f = jax.jit(jax.shard_map(_steered(loop, host, flavour, communicate),
                            mesh=mesh, in_specs=P("d"), out_specs=P("d")))
  _fails_with_boom(f, jnp.arange(4.0))
  # The failing device's host function ran up to the failure, and no later
  # step of it reached the host; the others ran on, in order, to a check
  # (one that had finished its loop by then raises at its finish). Devices
  # that communicate run in step with the failing one: they stop early.
  assert host.steps_of(1) == list(range(FAILING_STEP + 1))
  for device in (0, 2, 3):
    steps = host.steps_of(device)
    assert steps == list(range(len(steps)))
    if communicate:
      assert len(steps) < STEPS
  # Nothing is held back afterwards: the same devices call the host again.
  host.failing_device = None
  host.seen.clear()
  jax.block_until_ready(f(jnp.arange(4.0)))
  hostcall.barrier()
  assert host.steps_of(1) == list(range(STEPS))


@pytest.mark.parametrize("loop", _LOOPS)
def test_a_failure_on_one_device_fails_the_call_under_pmap(loop):
  host = Host(failing_device=2)
  f = jax.pmap(_steered(loop, host, "debug_callback", False))
  _fails_with_boom(f, jnp.arange(4.0)[:, None])
  assert host.steps_of(2) == list(range(FAILING_STEP + 1))


@pytest.mark.parametrize("loop", _LOOPS)
def test_a_failure_in_a_global_view_fails_the_call(loop):
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))
  host = Host(failing_device=0)  # the one device that calls the host
  _fails_with_boom(jax.jit(_steered(loop, host, "debug_callback", False)), x)
  assert host.steps_of(0) == list(range(FAILING_STEP + 1))


@pytest.mark.parametrize("loop", _LOOPS)
def test_a_global_view_finish_after_the_loop_closed_raises_the_failure(
    loop, monkeypatch):
  # A global view's loop is opened and closed by one device, and finished
  # on every device: here the other devices finish only once the close was
  # delivered (the invocation released), as a busy machine may order them.
  from hostcall._apps.loops import events as loop_events
  from hostcall._apps.control import host as control_host
  released, waited = threading.Event(), []
  real_release, real_deliver = (control_host.controls.release,
                                loop_events._Finish.deliver)

  def release(group_key):
    real_release(group_key)
    released.set()

  def deliver(self, flat_args, context):
    if context.device.id != 0:
      waited.append(released.wait(60))
    return real_deliver(self, flat_args, context)

  monkeypatch.setattr(control_host.controls, "release", release)
  monkeypatch.setattr(loop_events._Finish, "deliver", deliver)
  mesh = Mesh(np.array(jax.devices()), ("d",))
  x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("d")))
  host = Host(failing_device=0)
  _fails_with_boom(jax.jit(_steered(loop, host, "debug_callback", False)), x)
  assert waited == [True] * 3
  assert host.steps_of(0) == list(range(FAILING_STEP + 1))


def test_a_nested_steered_loop_on_the_failing_device_stops_at_once():
  mesh = Mesh(np.array(jax.devices()), ("d",))
  host = Host(failing_device=3)

  def outer(x):
    def step(c, i):
      inner = progress.scan(
          lambda c, j: (c + hostcall.pure_callback(
              host, jax.ShapeDtypeStruct((), jnp.int32), i * 10 + j), None),
          c, jnp.arange(10), file=io.StringIO(), time_limit=3600.0)
      return inner.value[0], None
    out = progress.scan(step, x * 0, jnp.arange(100), every=5,
                        file=io.StringIO(), interruptible=True)
    return out.value[0]

  f = jax.jit(jax.shard_map(outer, mesh=mesh, in_specs=P("d"),
                            out_specs=P("d")))
  _fails_with_boom(f, jnp.arange(4.0))
  assert host.steps_of(3) == list(range(FAILING_STEP + 1))


def test_paced_chunks_are_the_same_on_every_device():
  # A host-paced while_loop (every=None) whose body communicates: every
  # device runs the same steps between checks, so that stopping at the same
  # check never leaves one waiting in a psum for another.
  mesh = Mesh(np.array(jax.devices()), ("d",))

  def f(x):
    out = control.while_loop(
        lambda s: s[0] < 10**9,
        lambda s: (s[0] + 1, s[1] + x + jax.lax.psum(s[1], "d") * 0.0),
        (0, x * 0),
        stop_when=lambda status: status.steps >= 2000)
    return out.value[1], out.steps[None]

  carry, steps = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"),
                                       out_specs=P("d")))(jnp.arange(4.0))
  hostcall.barrier()
  steps = np.asarray(steps)
  assert len(set(steps.tolist())) == 1 and 2000 <= steps[0] < 10**9
  np.testing.assert_array_equal(carry, np.arange(4.0) * steps[0])
