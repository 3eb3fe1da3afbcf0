"""hostcall's own loops fail as the ``lax.scan`` they replace.

A host function raising at step 3 of 10 is run through ``lax.scan``, and
through ``hostcall.scan`` (every chunk size) and ``hostcall.progress.scan``
(plain and steered): the JAX call's outcome, the host calls made (which
steps, in order) and what the next barrier raises must be the same, for
every flavour of host call without results and both deliveries.
"""

import io

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import hostcall
from hostcall import host_callback as hcb

STEPS, FAILING = 10, 3


def _flavours(host):
  return {
      "debug_callback": lambda x: hostcall.debug_callback(host, x),
      "debug_callback_ordered": lambda x: hostcall.debug_callback(
          host, x, ordered=True),
      "io_callback": lambda x: hostcall.io_callback(host, None, x),
      "io_callback_ordered": lambda x: hostcall.io_callback(
          host, None, x, ordered=True),
      "id_tap": lambda x: hcb.id_tap(lambda v, _: host(v), x),
  }


_LOOPS = {
    "hostcall.scan every=64": lambda body, xs: hostcall.scan(
        body, 0, xs, every=64),
    "hostcall.scan every=2": lambda body, xs: hostcall.scan(
        body, 0, xs, every=2),
    "progress.scan": lambda body, xs: hostcall.progress.scan(
        body, 0, xs, file=io.StringIO()),
    "steered progress.scan": lambda body, xs: hostcall.progress.scan(
        body, 0, xs, file=io.StringIO(), time_limit=3600.0).value,
}


def _outcome(loop, flavour, exception, delivery):
  """What the host saw, how the call ended, what the barrier raised."""
  seen = []

  def host(x):
    seen.append(int(x))
    if int(x) == FAILING:
      raise exception("boom at step 3")

  tap = _flavours(host)[flavour]

  def body(carry, x):
    tap(x)
    return carry + x, None

  try:
    with hostcall.delivery(delivery):  # the delivery is fixed when traced
      jax.block_until_ready(jax.jit(lambda xs: loop(body, xs))(
          jnp.arange(STEPS)))
    call = "returned"
  except jax.errors.JaxRuntimeError as exc:
    assert "boom at step 3" in str(exc)
    call = "failed"
  try:
    hostcall.barrier()
    barrier = "nothing"
  except hcb.CallbackException as exc:
    assert "boom at step 3" in str(exc)
    barrier = "CallbackException"
  return seen, call, barrier


@pytest.mark.parametrize("delivery", ["sync", "async"])
@pytest.mark.parametrize("flavour", list(_flavours(None)))
@pytest.mark.parametrize("loop", list(_LOOPS))
def test_a_failing_host_call_fails_as_in_lax_scan(loop, flavour, delivery):
  expected = _outcome(lambda body, xs: lax.scan(body, 0, xs), flavour,
                      ValueError, delivery)
  assert _outcome(_LOOPS[loop], flavour, ValueError, delivery) == expected
  # And what that is, spelled out: a call that fails its computation stops
  # it at once (no later step reaches the host); a tap, or anything
  # delivered asynchronously, is reported by the barrier after every step.
  stops = delivery == "sync" and flavour != "id_tap"
  assert expected == (
      (list(range(FAILING + 1)), "failed", "nothing") if stops
      else (list(range(STEPS)), "returned", "CallbackException"))


@pytest.mark.parametrize("loop", list(_LOOPS))
def test_ctrl_c_in_a_synchronous_tap_stops_the_loop_as_in_lax_scan(loop):
  expected = _outcome(lambda body, xs: lax.scan(body, 0, xs), "id_tap",
                      KeyboardInterrupt, "sync")
  assert expected == (list(range(FAILING + 1)), "failed", "nothing")
  assert _outcome(_LOOPS[loop], "id_tap", KeyboardInterrupt,
                  "sync") == expected


def test_a_loop_opened_where_a_failure_is_contained_stops_at_its_first_check(
    monkeypatch):
  # A steered loop nested in the chunk of one whose host function failed
  # (on the same device) inherits the failure: its first check stops it.
  from hostcall._apps.control import FAILED, Stop, host
  from hostcall._apps.control import stop_states_library as library
  from hostcall._apps.control import states
  from hostcall._core.context import make_context
  stop_states = states.StopStates(library.load())
  # Each its own invocation (a bar's (site, index)).
  monkeypatch.setattr(host._loops.invocations, "group_of",
                      lambda h: ("site", h))
  controls = host._Controls(stop_states)
  stop = Stop.of(False, 3600.0, None)
  outer, inner = 2_000_001, 2_000_002  # handles no bar uses
  device = jax.devices()[0]
  controls.open(outer, stop, device)
  assert controls.take(make_context((), device), ValueError("boom"))
  controls.open(inner, stop, device)
  try:
    assert controls.poll(inner, 1) == FAILED
  finally:
    for handle in (inner, outer):
      controls.end(handle)
      controls.close(handle)
      controls.release(("site", handle))  # (the loops' release)
  assert not controls.failing
  # The failure was never raised by a finish: once both invocations are
  # released, the barrier hook (this instance's, called as the process's
  # is) reports it, and the barrier raises it.
  hostcall.barrier()  # (this instance's hook is not the process's)
  controls.after_barrier()
  with pytest.raises(hcb.CallbackException, match="boom"):
    hostcall.barrier()
