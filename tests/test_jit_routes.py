"""hostcall.jit's routes (``hostcall._jit.routes``): the one place that
chooses how a program's host calls leave it, from what the process's
devices allow."""

import jax.numpy as jnp
import pytest

import hostcall
from hostcall._jit import routes


@pytest.fixture
def process(monkeypatch):
  """Fakes the process's facts; the real ones are found again after."""
  def fake(queues, several):
    monkeypatch.setattr(routes, "_process", routes.Process(queues, several))
    routes.current[0] = None
  yield fake
  routes.forget_process()


# (the native queue, several devices, every call as outputs) -> the route
CHOICES = [
    (False, False, False, routes.AsOutputs),
    (False, True, False, routes.AsOutputs),
    (True, False, False, routes.Queued),
    (True, True, False, routes.QueuedOnSeveral),
    (True, False, True, routes.AsOutputs),
    (True, True, True, routes.AsOutputs),
    (False, False, True, routes.AsOutputs),
]


@pytest.mark.parametrize("queues, several, outputs_only, expected", CHOICES)
def test_the_route_follows_the_process(process, queues, several,
                                       outputs_only, expected):
  process(queues, several)
  previous = routes.set_outputs_only(outputs_only)
  try:
    assert routes.chosen() is expected
    assert routes.queues() is issubclass(expected, routes.Queued)
  finally:
    routes.set_outputs_only(previous)


def test_each_route_takes_calls_out_by_its_own_rules():
  assert routes.Queued.rules.queued and routes.QueuedOnSeveral.rules.queued
  assert not routes.AsOutputs.rules.queued
  assert not routes.Marked.rules.queued and routes.Marked.marks


def test_a_function_takes_the_route_chosen_when_it_is_called():
  # A function called on one route, then after the choice changed, takes
  # the new route (its dispatch kept the old one's call until then). (Two
  # routes deliver on two threads: only a barrier orders them, which is why
  # a process keeps one.)
  seen = []
  step = hostcall.jit(lambda x: (hostcall.debug_callback(
      lambda v: seen.append(int(v)), x), x + 1)[1])
  jitted = step._hostcall_jitted
  first = routes.chosen()
  assert int(step(jnp.int32(0))) == 1
  hostcall.barrier()
  with routes.calls_as_outputs():
    assert routes.chosen() is routes.AsOutputs
    assert int(step(jnp.int32(1))) == 2
    hostcall.barrier()
  assert int(step(jnp.int32(2))) == 3
  hostcall.barrier()
  assert seen == [0, 1, 2]
  assert set(jitted._routes) == {first, routes.AsOutputs}
  assert routes.chosen() is first
