"""The stop check as a component of its own: one implementation
(``StopStates``, ``hostcall_control.cc``) and its rules; the compiled check
reaches it through its FFI handler, or through a Python callback with
``HOSTCALL_NATIVE=0`` (a platform without the handler), and a steered loop
with a predicate stops the same on either route; without the extension, a
clear error naming the fix."""

import os
import pathlib
import site
import subprocess
import sys
import textwrap
import threading

import pytest

from hostcall._apps.control import stop_states_library, states
from hostcall._apps.control.spec import FAILED, STOP_WHEN, TIME_LIMIT, Stop

ROOT = pathlib.Path(__file__).parent.parent

# Handles and groups that no loop of the test process uses (a bar's
# handles count from 1; the native stop states are the process's).
HANDLE, GROUP = 9_000_001, 9_000_001


@pytest.fixture
def stop_states():
  made = states.StopStates(stop_states_library.load())
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


@pytest.mark.parametrize("reason, requested, opened, asks", [
    (0, None, True, 0),             # ran to its end: nothing to raise
    (TIME_LIMIT, None, True, 0),    # stopped, for no failure
    (STOP_WHEN, STOP_WHEN, True, 0),
    (0, FAILED, True, 1),           # its group contained a failure
    (TIME_LIMIT, FAILED, True, 1),
    (FAILED, None, True, 1),        # stopped for another's failure
    (0, None, False, 1),            # a handle it cannot tell about
])
def test_the_devices_own_finish_asks_the_host_only_for_a_failure(
    stop_states, reason, requested, opened, asks):
  # hostcall.jit's steered loop ends itself on the device
  # (control.finish_here, the FFI handler hostcall_control_finish): it
  # takes no more Ctrl-C, and the host's finish runs only where there is a
  # failure to raise.
  import jax
  from hostcall._apps import control
  if opened:
    stop_states.open(HANDLE, GROUP, Stop.of(True, 3600.0, None))
    assert stop_states.running(HANDLE) and stop_states.sigint_installed()
    if requested is not None:
      stop_states.request(GROUP, requested)
  finish = jax.jit(control.finish_here)
  assert int(finish(HANDLE, reason)) == asks
  assert not stop_states.running(HANDLE)
  assert not stop_states.sigint_installed()
  # What is left for the close: the handle stays known until it.
  if opened:
    assert stop_states.poll(HANDLE, 1) == (requested or 0)


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


def test_the_compiled_check_calls_the_stop_states_through_its_handler():
  out = _run(_CHOSEN, {"HOSTCALL_NATIVE": "1"}).stdout.splitlines()
  # The compiled check calls the library (an FFI custom call).
  assert out == ["True True time_limit"]


def test_hostcall_native_0_checks_through_a_python_callback_without_a_word():
  out = _run(_CHOSEN, {"HOSTCALL_NATIVE": "0"}).stdout.splitlines()
  assert out == ["False False time_limit"]


_WITHOUT_THE_EXTENSION = """
    import jax, hostcall
    from hostcall._runtime import libraries
    print(hostcall.debug_callback(lambda x: None, 1.0) is None)
    # hostcall.jit needs no native code: its calls become outputs.
    seen = []
    step = hostcall.jit(lambda x: (hostcall.debug_callback(seen.append, x),
                                   x + 1)[1])
    print(float(step(1.0)), hostcall.barrier(), [float(v) for v in seen])
    for attempt in range(2):
      try:
        jax.jit(lambda: hostcall.control.while_loop(
            lambda c: c < 10, lambda c: c + 1, 0, time_limit=5.0))()
      except libraries.HostcallNativeError as exc:
        print(type(exc).__name__, exc)
    """


def test_a_stop_check_without_the_extension_is_a_clear_error():
  # hostcall imported from a source tree that was never installed: no
  # extension; a steered loop raises, each time, naming the fix, and a
  # host call that needs no native code still runs.
  out = _run(_WITHOUT_THE_EXTENSION, {"HOSTCALL_NATIVE": "1",
                                      **_SOURCE_TREE},
             flags=("-S",)).stdout.splitlines()
  assert out[:2] == ["True", "2.0 None [1.0]"]
  out = out[1:]
  assert len(out) == 3 and out[1] == out[2]
  assert out[1].startswith(
      "HostcallNativeError hostcall: the native stop check is not "
      "available: hostcall's native extension hostcall._native is not "
      f"installed with the hostcall imported from {ROOT / 'src' / 'hostcall'}")
  assert "`pip install .`, or `pip install -e .` in a source tree" in out[1]


_PREDICATE = """
    import jax, jax.numpy as jnp, hostcall
    from hostcall._apps.control import controls
    from hostcall._runtime import tap_queue
    # A tick left gathering would hold every check that waits for the
    # predicate 60 s (PREDICATE_WAIT): past the caller's timeout.
    tap_queue.consumer.gather = 3600.0
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


@pytest.mark.parametrize("handlers", ["1", "0"])
def test_a_predicate_stops_the_loop_on_either_route(handlers):
  proc = _run(_PREDICATE, {"HOSTCALL_NATIVE": handlers}, timeout=150)
  out = proc.stdout.strip().split(maxsplit=4)
  assert out[:3] == [str(handlers == "1")] * 2 + ["stop_when"]
  assert out[3] in ("300", "400") and out[4] == "[100, 200, 300]"
