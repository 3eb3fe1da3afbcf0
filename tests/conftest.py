import io

import jax
import numpy as np
import pytest

import hostcall
from hostcall import host_callback as hcb
from hostcall._runtime import errors, tap_queue
from hostcall._runtime.barriers import wait_without_raising


@pytest.fixture(autouse=True)
def _no_leftover_tap_errors():
  """Each test starts with nothing pending and must end so: every host call
  it started delivered, and every tap exception it caused raised by a
  barrier it asserted on (not left for the next test)."""
  wait_without_raising()
  errors.take_postponed()
  yield
  wait_without_raising()
  leftover = errors.take_postponed()
  if leftover is not None:
    exc, formatted, count = leftover
    pytest.fail(f"the test left {count} tap exception(s) no barrier raised; "
                f"the last:\n{formatted}", pytrace=False)


class Recorder:
  """A tap function that records what the host received, in order."""

  def __init__(self):
    self.calls = []

  def __call__(self, arg, transforms, device=None):
    self.calls.append((jax.tree_util.tree_map(np.asarray, arg),
                       tuple(transforms), device))

  def labelled(self, label):
    """A tap function recording ``(label, value)`` into the same log."""
    def tap(arg, transforms, device=None):
      self.calls.append(((label, jax.tree_util.tree_map(np.asarray, arg)),
                         tuple(transforms), device))
    return tap

  @property
  def values(self):
    return [jax.tree_util.tree_map(
        lambda a: a.tolist() if isinstance(a, np.ndarray) else a, c[0])
            for c in self.calls]

  @property
  def transforms(self):
    return [c[1] for c in self.calls]


@pytest.fixture
def recorder():
  return Recorder()


@pytest.fixture
def stream():
  return io.StringIO()


# tests/multidevice needs 4 CPU devices, which must be configured before JAX
# starts: tests/test_multidevice.py runs it in its own pytest process.
collect_ignore_glob = []
if jax.device_count() < 4:
  collect_ignore_glob.append("multidevice/*")


@pytest.fixture
def window():
  """Sets the delivery thread's window (bypassing the 1 s bound, to make a
  missed wake-up a hang) and restores the default after the test."""
  def set_window(seconds, idle=None):
    hostcall.barrier()
    tap_queue.consumer.gather = seconds
    tap_queue.consumer.idle_gather = seconds if idle is None else idle
    # The delivery thread may be in a trip begun with the old window: a
    # barrier with nothing queued does not end it; one tap does.
    jax.jit(lambda: hcb.id_tap(lambda *a: None, 0, delivery="async"))()
    hostcall.barrier()
  yield set_window
  set_window(tap_queue.DEFAULT_GATHER, tap_queue.IDLE_GATHER)


@pytest.fixture
def queued():
  """Skips a test of hostcall.jit's queued route where calls become outputs
  (no native tap queue here); the queue started."""
  from hostcall._jit import routes
  hostcall.barrier()
  if not routes.queues():
    pytest.skip("no native tap queue here: calls become outputs")


@pytest.fixture(params=["queued", "outputs"])
def jit_route(request, monkeypatch):
  """Both ways hostcall.jit takes a program's calls out: queued from the
  device (one CPU device with the native queue; skipped elsewhere), or
  deferred to the program's outputs."""
  from hostcall._jit import routes
  if request.param == "queued":
    hostcall.barrier()  # the native queue started
    if not routes.queues():
      pytest.skip("no native tap queue here: calls become outputs")
  previous = routes.set_outputs_only(request.param == "outputs")
  request.addfinalizer(lambda: routes.set_outputs_only(previous))
  return request.param
