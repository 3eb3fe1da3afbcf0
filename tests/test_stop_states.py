"""The stop check as a component of its own: one interface over its two
implementations (``StopStates``: native, ``hostcall_control.cc``; Python),
each following the same rules; the implementation chosen once per process,
native where its own library loads; and chosen apart from the queue's (a
steered loop with a predicate works with either stop states over either
queue)."""

import os
import pathlib
import site
import subprocess
import sys
import textwrap
import threading

import pytest

from hostcall._apps.control import native, states
from hostcall._apps.control.spec import FAILED, STOP_WHEN, TIME_LIMIT, Stop

ROOT = pathlib.Path(__file__).parent.parent

# Handles and groups that no loop of the test process uses (a bar's
# handles count from 1; the native stop states are the process's).
HANDLE, GROUP = 9_000_001, 9_000_001


def _make(kind: str) -> states.StopStates:
  if kind == "python":
    return states.PythonStopStates()
  lib = native.load()
  if lib is None:
    pytest.skip(f"the stop check's library cannot be had here "
                f"({native.LIBRARY.error})")
  return states.NativeStopStates(lib)


@pytest.fixture(params=["native", "python"])
def stop_states(request):
  made = _make(request.param)
  assert made.native is (request.param == "native")
  yield made
  for handle in range(HANDLE, HANDLE + 4):
    made.close(handle)


def test_the_devices_of_an_invocation_stop_after_the_same_check(stop_states):
  stop = Stop.of(False, 3600.0, None)
  first, second = HANDLE, HANDLE + 1
  stop_states.open(first, GROUP, stop)
  stop_states.open(second, GROUP, stop)
  assert [stop_states.poll(first, 1), stop_states.poll(second, 1),
          stop_states.poll(first, 2)] == [0, 0, 0]
  stop_states.request(GROUP, STOP_WHEN)
  # The first check to see the request fixes the stop one past the highest
  # check made (2): the device behind runs its check 2 too.
  assert stop_states.poll(second, 2) == 0
  assert stop_states.poll(first, 3) == STOP_WHEN
  assert stop_states.poll(second, 3) == STOP_WHEN
  # A group of its own is not asked.
  stop_states.open(HANDLE + 2, GROUP + 1, stop)
  assert stop_states.poll(HANDLE + 2, 1) == 0


def test_a_failure_outranks_a_reason_asked_for_before_it(stop_states):
  stop_states.open(HANDLE, GROUP, Stop.of(False, 3600.0, None))
  stop_states.request(GROUP, STOP_WHEN)
  stop_states.request(GROUP, FAILED)
  stop_states.request(GROUP, STOP_WHEN)   # a failure is not overwritten
  assert stop_states.poll(HANDLE, 1) == FAILED


def test_a_passed_time_limit_stops_at_the_next_check(stop_states):
  stop_states.open(HANDLE, GROUP, Stop.of(False, 1e-9, None))
  assert stop_states.poll(HANDLE, 1) == TIME_LIMIT
  assert stop_states.poll(HANDLE, 2) == TIME_LIMIT


def test_a_check_waits_until_the_predicate_saw_the_chunk_before(stop_states):
  stop_states.open(HANDLE, GROUP,
                   Stop.of(False, None, lambda status: False))
  assert stop_states.poll(HANDLE, 1) == 0   # no chunk before it
  answers = []
  waiting = threading.Thread(
      target=lambda: answers.append(stop_states.poll(HANDLE, 2)))
  waiting.start()
  stop_states.evaluated(HANDLE)   # the predicate saw chunk 1
  waiting.join(60)
  assert not waiting.is_alive() and answers == [0]
  # A request answers a check that waits for the predicate.
  waiting = threading.Thread(
      target=lambda: answers.append(stop_states.poll(HANDLE, 3)))
  waiting.start()
  stop_states.request(GROUP, STOP_WHEN)
  waiting.join(60)
  assert not waiting.is_alive() and answers == [0, STOP_WHEN]


def test_a_closed_handle_is_forgotten(stop_states):
  stop_states.open(HANDLE, GROUP, Stop.of(False, 1e-9, None))
  stop_states.close(HANDLE)
  assert stop_states.poll(HANDLE, 1) == 0
  stop_states.close(HANDLE)   # twice: nothing to do
  assert not stop_states.sigint_installed()
  assert isinstance(stop_states.interrupts(), int)


def _run(code: str, env: dict, timeout: float = 300, flags=()
         ) -> subprocess.CompletedProcess:
  proc = subprocess.run(
      [sys.executable, *flags, "-c", textwrap.dedent(code)],
      capture_output=True,
      text=True, cwd=ROOT, timeout=timeout, env={**os.environ, **env})
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


# hostcall from the source tree, never installed (with ``python -S``: no
# site-packages .pth file, so no editable install's redirection), the
# installed packages (jax) from site-packages.
_SOURCE_TREE = {"PYTHONPATH": os.pathsep.join(
    [str(ROOT / "src"), *site.getsitepackages()])}


_CHOSEN = """
    import warnings
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      import jax, hostcall
      from hostcall._apps.control import controls
      loop = jax.jit(lambda: hostcall.control.while_loop(
          lambda c: c < 2**31 - 2, lambda c: c + 1, 0, every=1000,
          time_limit=0.05))
      text = loop.lower().as_text()
      out = loop()
      hostcall.barrier()
    print(controls.native, "hostcall_control_check" in text,
          hostcall.control.reason_name(out.reason))
    for w in caught:
      print(w.category.__name__, w.message)
    """


def test_the_stop_check_is_native_wherever_its_library_can_be_had():
  can_have = native.LIBRARY.installed()
  out = _run(_CHOSEN, {"HOSTCALL_NATIVE": "1"}).stdout.splitlines()
  # Native: the compiled check calls the library (an FFI custom call).
  assert out[0] == f"{can_have} {can_have} time_limit"


def test_hostcall_native_0_chooses_the_python_stop_check_without_a_word():
  out = _run(_CHOSEN, {"HOSTCALL_NATIVE": "0"}).stdout.splitlines()
  assert out == ["False False time_limit"]


def test_a_stop_check_without_the_extension_falls_back_and_says_so():
  # hostcall imported from a source tree that was never installed: no
  # extension, the Python checks, and one warning naming the fix.
  out = _run(_CHOSEN, {"HOSTCALL_NATIVE": "1", **_SOURCE_TREE},
             flags=("-S",)).stdout
  first, *warned = out.splitlines()
  assert first == "False False time_limit"
  said = [line for line in warned if "stop check" in line]
  assert len(said) == 1 and said[0].startswith(
      "HostcallNativeWarning hostcall: the native stop check is not "
      "available (hostcall's native extension hostcall._native is not "
      f"installed with the hostcall imported from {ROOT / 'src' / 'hostcall'}")
  assert "`pip install .`, or `pip install -e .` in a source tree" in said[0]


_PREDICATE = """
    import jax, jax.numpy as jnp, hostcall
    from hostcall._apps.control import controls, native as control_native
    from hostcall._runtime import native as queue_native, queue
    if {python_states}:
      control_native.LIBRARY.load = lambda: None
    if {python_queue}:
      queue_native.LIBRARY.load = lambda: None
    # A tick left gathering would hold every check that waits for the
    # predicate 60 s (PREDICATE_WAIT): past the caller's timeout.
    queue.consumer.gather = 3600.0
    seen = []
    def stop_when(status):
      seen.append(status.steps)
      return status.steps >= 300
    out = jax.jit(lambda x: hostcall.progress.scan(
        lambda c, _: (c * 1.0001, None), x, length=2000, every=100,
        stop_when=stop_when, disable=True))(jnp.float32(1.0))
    hostcall.barrier()
    print(controls.native, hostcall.queue_stats()["native"],
          hostcall.control.reason_name(out.reason), int(out.steps), seen[:3])
    """


@pytest.mark.parametrize("stop_check, queue", [
    ("native", "python"), ("python", "native")])
def test_the_stop_check_and_the_queue_are_chosen_apart(stop_check, queue):
  if not native.LIBRARY.installed():
    pytest.skip("hostcall's native extension is not installed")
  code = _PREDICATE.format(python_states=stop_check == "python",
                           python_queue=queue == "python")
  proc = _run(code, {"HOSTCALL_NATIVE": "1"}, timeout=150)
  out = proc.stdout.strip().split(maxsplit=4)
  assert out[:3] == [str(stop_check == "native"), str(queue == "native"),
                     "stop_when"]
  assert out[3] in ("300", "400") and out[4] == "[100, 200, 300]"
