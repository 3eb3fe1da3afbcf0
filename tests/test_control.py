"""Steering compiled loops from the host: Ctrl-C, time limits and host
predicates stop a running loop at its next check, which returns its state."""

import io
import math
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import control
from hostcall._apps.loops import invocations as loops_module

ROOT = pathlib.Path(__file__).parent.parent


def _step(c, _):
  c = c * 1.0001 + 0.001
  return c, c


def _reference(steps):
  """An uninterrupted loop of ``steps`` steps: what the steps done give."""
  return jax.lax.scan(_step, jnp.float32(1.0), None, length=steps)


def _scan(n=200_000, **options):
  return jax.jit(lambda x: hostcall.progress.scan(
      _step, x, length=n, file=io.StringIO(), **options))


def _assert_prefix_of_uninterrupted(out, n):
  steps = int(out.steps)
  carry, ys = out.value
  ref_carry, ref_ys = _reference(steps)
  np.testing.assert_array_equal(carry, ref_carry)
  np.testing.assert_array_equal(ys[:steps], ref_ys)
  assert not np.asarray(ys[steps:]).any()  # the steps not run: zeros
  assert ys.shape == (n,)


def test_a_predicate_stops_the_scan_within_one_check():
  seen = []

  def stop_when(status):
    seen.append(status.steps)
    return status.steps >= 30_000

  out = _scan(every=1000, stop_when=stop_when)(jnp.float32(1.0))
  hostcall.barrier()
  assert bool(out.stopped) and control.reason_name(out.reason) == "stop_when"
  assert int(out.reason) == control.STOP_WHEN
  # Decided after the chunk ending at 30,000: that chunk's check or the
  # next one stops the loop (the device runs at most one chunk ahead).
  assert int(out.steps) in (30_000, 31_000)
  assert seen[:30] == list(range(1000, 30_001, 1000))
  _assert_prefix_of_uninterrupted(out, 200_000)


def test_a_time_limit_stops_the_loop_and_keeps_its_state():
  elapsed = []

  def watch(status):
    elapsed.append(status.elapsed)
    return False  # only watches: the time limit stops the loop

  n, every = 2_000_000_000, 200_000  # seconds of steps, a check a ms
  out = jax.jit(lambda x: hostcall.progress.scan(
      lambda c, _: (_step(c, _)[0], None), x, length=n, every=every,
      file=io.StringIO(), time_limit=0.3, stop_when=watch))
  value, stopped, steps, _ = out(jnp.float32(1.0))
  hostcall.barrier()
  assert bool(stopped) and 0 < int(steps) < n and int(steps) % every == 0
  # Every check saw less than the limit but the last one or two.
  past = [e for e in elapsed if e >= 0.3]
  assert len(past) <= 2 and len(elapsed) == int(steps) // every


def test_a_loop_that_ends_first_is_not_stopped():
  out = _scan(n=5000, time_limit=3600.0)(jnp.float32(1.0))
  assert not bool(out.stopped) and int(out.steps) == 5000
  assert control.reason_name(out.reason) is None
  _assert_prefix_of_uninterrupted(out, 5000)


@pytest.mark.parametrize("jit", [jax.jit, hostcall.jit],
                         ids=["jax.jit", "hostcall.jit"])
def test_a_stop_at_the_check_after_the_last_step_is_reported(jit):
  # A time limit already past is read at the first check, which comes after
  # the last step (one chunk): nothing is skipped, the stop is reported
  # (docs/control.md), under vmap for a lane that ended there by itself too.
  bar = io.StringIO()
  scan = jit(lambda x: hostcall.progress.scan(
      lambda c, _: (c + 1, c), x, None, length=4, every=4, time_limit=1e-9,
      file=bar))(jnp.int32(0))
  loop = jit(lambda n: control.while_loop(
      lambda c: c < n, lambda c: c + 1, 0, every=3, time_limit=1e-9))(3)
  lanes = jit(jax.vmap(lambda n: hostcall.progress.while_loop(
      lambda c: c < n, lambda c: c + 1, 0, every=3, time_limit=1e-9,
      file=io.StringIO())))(jnp.array([3, 100]))
  hostcall.barrier()
  assert (bool(scan.stopped), int(scan.steps), int(scan.reason)) == (
      True, 4, control.TIME_LIMIT)
  assert scan.value[0].tolist() == 4 and scan.value[1].tolist() == [0, 1, 2, 3]
  assert "stopped" in bar.getvalue() and "4/4" in bar.getvalue()
  assert (bool(loop.stopped), int(loop.steps), int(loop.value)) == (True, 3, 3)
  assert np.asarray(lanes.stopped).tolist() == [True, True]
  assert np.asarray(lanes.steps).tolist() == [3, 3]
  assert np.asarray(lanes.reason).tolist() == [control.TIME_LIMIT] * 2
  assert np.asarray(lanes.value).tolist() == [3, 3]


@pytest.mark.parametrize("loop", ["while_loop", "fori_loop dynamic",
                                  "fori_loop static", "control.while_loop"])
def test_every_loop_returns_its_state_at_the_stop(loop):
  stop = lambda status: status.steps >= 2000  # noqa: E731
  body = lambda i, c: c + i  # noqa: E731
  run = {
      "while_loop": lambda n: hostcall.progress.while_loop(
          lambda c: c[0] < n, lambda c: (c[0] + 1, body(c[0], c[1])), (0, 0),
          every=100, stop_when=stop, file=io.StringIO()),
      "fori_loop dynamic": lambda n: hostcall.progress.fori_loop(
          0, n, body, 0, every=100, stop_when=stop, file=io.StringIO()),
      "fori_loop static": lambda n: hostcall.progress.fori_loop(
          0, 10**6, body, 0, every=100, stop_when=stop, file=io.StringIO()),
      "control.while_loop": lambda n: control.while_loop(
          lambda c: c[0] < n, lambda c: (c[0] + 1, body(c[0], c[1])), (0, 0),
          every=100, stop_when=stop),
  }[loop]
  out = jax.jit(run)(10**6)
  hostcall.barrier()
  steps = int(out.steps)
  # The predicate said stop after the chunk ending at step 2000: the check
  # of that chunk or of the next one stops the loop.
  assert bool(out.stopped) and steps in (2000, 2100)
  total = out.value[1] if isinstance(out.value, tuple) else out.value
  assert int(total) == sum(range(steps))


def test_under_vmap_every_lane_stops_after_the_same_step():
  out = jax.jit(jax.vmap(lambda x: hostcall.progress.scan(
      _step, x, length=100_000, every=1000, file=io.StringIO(),
      stop_when=lambda status: status.steps >= 5000)))(jnp.arange(3.0))
  hostcall.barrier()
  assert np.asarray(out.stopped).tolist() == [True] * 3
  steps = np.asarray(out.steps).tolist()
  assert steps in ([5000] * 3, [6000] * 3)


def test_grad_through_a_steered_scan():
  def loss(x):
    out = hostcall.progress.scan(_step, x, length=100, every=10,
                                 file=io.StringIO(), time_limit=3600.0)
    return out.value[0]

  np.testing.assert_allclose(jax.jit(jax.grad(loss))(jnp.float32(1.0)),
                             jax.grad(lambda x: _reference_from(x, 100))(
                                 jnp.float32(1.0)), rtol=1e-6)


def _reference_from(x, steps):
  return jax.lax.scan(_step, x, None, length=steps)[0]


def test_a_stopped_loop_leaves_no_bars_taps_or_threads():
  run = _scan(every=1000, stop_when=lambda status: status.steps >= 3000)
  run(jnp.float32(1.0))
  hostcall.barrier()
  threads = threading.active_count()
  for _ in range(3):
    run(jnp.float32(1.0))
  hostcall.barrier()
  assert not loops_module.invocations._open
  assert hostcall.queue_stats()["queued"] == 0
  assert threading.active_count() == threads


def test_a_failing_predicate_stops_the_loop_and_the_barrier_says_why():
  def broken(status):
    raise ZeroDivisionError("no plateau here")

  out = _scan(every=1000, stop_when=broken)(jnp.float32(1.0))
  assert bool(out.stopped) and int(out.steps) <= 2000
  with pytest.raises(hostcall.CallbackException, match="no plateau here"):
    hostcall.barrier()


def test_plateau_stops_when_the_logged_loss_stalls(tmp_path):
  run = hostcall.metrics.Run("plateau", root=tmp_path, writers=["memory"])

  def step(c, _):
    run.log(c, loss=jnp.maximum(100.0 - c, 40.0))  # stalls from step 60
    return c + 1, None

  out = jax.jit(lambda: hostcall.progress.scan(
      step, 0, length=100_000, every=10, file=io.StringIO(),
      stop_when=control.plateau(run, "loss", patience=3)))()
  hostcall.barrier()
  # The best loss is logged at step 60 (seen by the check after step 70);
  # the checks after 80, 90 and 100 see no better: the one after 100 asks
  # to stop, and that check or the following one stops the loop.
  steps = int(out.steps)
  assert bool(out.stopped) and steps in (100, 110)
  assert run.latest("loss") == (steps - 1, 40.0)
  run.close()


@pytest.mark.parametrize("options, error, words", [
    (dict(time_limit=-1), ValueError, "time_limit is a number of seconds > 0"),
    (dict(time_limit="1h"), ValueError, "time_limit is a number of seconds"),
    (dict(interruptible="yes"), TypeError, "interruptible must be True or"),
    (dict(stop_when=3), TypeError, "stop_when must be a function"),
])
def test_bad_options_are_explained(options, error, words):
  with pytest.raises(error, match=words):
    hostcall.progress.scan(_step, 1.0, length=10, **options)


# Each loop that takes time_limit=, as a function of it, traced under jit.
_TIMED_LOOPS = {
    "progress.scan": lambda limit: hostcall.progress.scan(
        lambda c, _: (c + 1, None), 0, length=3000, every=100,
        time_limit=limit, file=io.StringIO()),
    "progress.fori_loop": lambda limit: hostcall.progress.fori_loop(
        0, 3000, lambda i, c: c + 1, 0, every=100, time_limit=limit,
        file=io.StringIO()),
    "progress.while_loop": lambda limit: hostcall.progress.while_loop(
        lambda c: c < 3000, lambda c: c + 1, 0, every=100, time_limit=limit,
        file=io.StringIO()),
    "control.while_loop": lambda limit: control.while_loop(
        lambda c: c < 3000, lambda c: c + 1, 0, every=100, time_limit=limit),
}


@pytest.mark.parametrize("loop", sorted(_TIMED_LOOPS))
@pytest.mark.parametrize("limit", [1e10, 1e300, math.inf],
                         ids=["1e10", "1e300", "inf"])
def test_any_time_limit_up_to_infinity_runs_the_loop_to_its_end(loop, limit):
  # The deadline of 1e10 s, in nanoseconds, is past int64: it wrapped round
  # to the past (stopping at the first check), and inf failed at run time.
  out = jax.jit(lambda: _TIMED_LOOPS[loop](limit))()
  hostcall.barrier()
  assert not bool(out.stopped) and int(out.steps) == 3000
  assert control.reason_name(out.reason) is None
  carry = out.value[0] if isinstance(out.value, tuple) else out.value
  assert int(carry) == 3000


def test_huge_time_limits_work_on_the_python_callback_route_too():
  # HOSTCALL_NATIVE=0: the checks and taps go through JAX's callbacks.
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
      import io, math, warnings, jax, hostcall
      warnings.simplefilter("ignore")
      assert not hostcall.queue_stats()["native"]
      for limit in (1e10, 1e300, math.inf):
        out = jax.jit(lambda: hostcall.control.while_loop(
            lambda c: c < 3000, lambda c: c + 1, 0, every=100,
            time_limit=limit))()
        print(bool(out.stopped), int(out.steps))
      out = jax.jit(lambda: hostcall.control.while_loop(
          lambda c: c < 2**31 - 2, lambda c: c + 1, 0, every=10_000,
          time_limit=0.05))()
      print(hostcall.control.reason_name(out.reason))
      hostcall.barrier()
      """)], capture_output=True, text=True, cwd=ROOT, timeout=300,
      env={**os.environ, "HOSTCALL_NATIVE": "0"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["False", "3000"] * 3 + ["time_limit"]


@pytest.mark.parametrize("loop", sorted(_TIMED_LOOPS))
@pytest.mark.parametrize("limit, words", [
    (0, "got 0 of type int"), (-1.5, "got -1.5 of type float"),
    (math.nan, "got nan of type float"), (True, "got True of type bool"),
    ("1h", "got '1h' of type str"),
])
def test_a_time_limit_that_is_no_number_of_seconds_is_refused(loop, limit,
                                                              words):
  with pytest.raises(ValueError, match="time_limit is a number of seconds > 0 "
                     rf"\(math.inf: no limit\), {words}\. Pass a Python "
                     "number of seconds"):
    jax.jit(lambda: _TIMED_LOOPS[loop](limit))()


@pytest.mark.parametrize("loop", sorted(_TIMED_LOOPS))
def test_a_traced_time_limit_is_refused_when_traced(loop):
  with pytest.raises(ValueError, match=r"time_limit .* known when the loop is "
                     r"traced .*got a traced value \(JitTracer.*Pass a Python "
                     "number of seconds.*static argument"):
    jax.jit(_TIMED_LOOPS[loop])(5.0)


def test_reason_name_names_what_it_takes():
  assert [control.reason_name(r) for r in (0, 1, 2, np.int32(3))] == [
      None, "interrupted", "time_limit", "stop_when"]
  assert control.reason_name(jnp.full((4,), 2, jnp.int32)) == "time_limit"
  accepted = (r"0 \(ran to its end\), 1 \(interrupted\), 2 \(time_limit\), "
              r"3 \(stop_when\)")
  with pytest.raises(ValueError, match=f"reason_name got 7, .*one of "
                     f"{accepted}"):
    control.reason_name(7)
  for bad in ("x", None, 2.5, np.zeros(0, np.int32)):
    with pytest.raises(TypeError, match=f"reason_name takes a Result.reason "
                       f".*got {re.escape(repr(bad))}; it is one of "
                       f"{accepted}"):
      control.reason_name(bad)
  with pytest.raises(TypeError, match="got a traced value .* call it on the "
                     "Result the jitted function returns"):
    jax.jit(control.reason_name)(2)


def test_plateau_refuses_what_is_no_run_or_metric(tmp_path):
  with pytest.raises(TypeError, match="plateau watches a metric of a "
                     "hostcall.metrics.Run, got None of type NoneType"):
    control.plateau(None, "loss")
  run = hostcall.metrics.Run("p", root=tmp_path, writers=["memory"])
  with pytest.raises(TypeError, match="plateau's name is the metric's name "
                     r"\(a str, as given to run.log\), got 3 of type int"):
    control.plateau(run, 3)
  for bad in (-0.1, math.nan, math.inf, "0"):
    with pytest.raises(ValueError, match=f"min_delta is a finite number >= 0"
                       f".*got {re.escape(repr(bad))}"):
      control.plateau(run, "loss", min_delta=bad)
  with pytest.raises(ValueError, match="patience is a number of checks >= 1 "
                     r"\(a Python int\), got 2.5"):
    control.plateau(run, "loss", patience=2.5)
  with pytest.raises(TypeError, match="Run.latest takes a metric's name"):
    run.latest(3)
  run.close()


def test_control_while_loop_needs_a_reason_to_stop():
  with pytest.raises(TypeError, match="needs a reason to stop"):
    control.while_loop(lambda c: c < 3, lambda c: c + 1, 0)


@pytest.mark.parametrize("jit, asked, finishes", [
    (hostcall.jit, False, []),  # the device ends the loop itself
    (hostcall.jit, True, [0]),  # the device asks: the host's finish runs
    (jax.jit, False, [0]),      # a JAX callback, always
], ids=["hostcall.jit", "hostcall.jit asked", "jax.jit"])
def test_a_steered_loop_ends_on_the_device_and_ctrl_c_is_pythons_again(
    jit, asked, finishes, monkeypatch, window):
  # Under hostcall.jit the loop's finish is the device's own
  # (control.finish_here); the host's runs only where it asks (a failure
  # to raise). Either way the loop takes no more Ctrl-C once the call
  # returns, before its bar's close (queued: left gathering here) is
  # delivered.
  from hostcall._apps.loops import events as loop_events
  from hostcall._apps.control import controls
  window(3600.0)
  seen = []
  finish = controls.finish
  monkeypatch.setattr(controls, "finish",
                      lambda h, r: seen.append(int(r)) or finish(h, r))
  ask_first = loop_events._Finish.ask_first
  monkeypatch.setattr(
      loop_events._Finish, "ask_first",
      lambda self, h, r: jnp.maximum(ask_first(self, h, r), int(asked)))
  out = io.StringIO()
  result = jit(lambda x: hostcall.progress.while_loop(
      lambda c: c < 100, lambda c: c + x, 0, every=10, interruptible=True,
      time_limit=3600.0, file=out))(1)
  jax.block_until_ready(result)
  assert not controls.sigint_installed()
  assert "100step" not in out.getvalue().replace(" ", "")  # not closed yet
  hostcall.barrier()
  assert (int(result.value), bool(result.stopped), int(result.steps)) == (
      100, False, 100)
  assert seen == finishes
  assert "100step" in out.getvalue().replace(" ", "")


@pytest.mark.parametrize("jit", [jax.jit, hostcall.jit],
                         ids=["jax.jit", "hostcall.jit"])
@pytest.mark.parametrize("loop", ["progress.while_loop",
                                  "control.while_loop"])
def test_a_steered_while_loop_over_no_lane_returns_no_lane(jit, loop):
  # vmap over 0 lanes: the check's batching reduced over no lane (an
  # error while tracing) before.
  def steered(limit):
    if loop == "control.while_loop":
      return control.while_loop(lambda c: c < limit, lambda c: c + 1, 0,
                                every=5, time_limit=3600.0)
    return hostcall.progress.while_loop(
        lambda c: c < limit, lambda c: c + 1, 0, every=5,
        time_limit=3600.0, file=io.StringIO())
  result = jit(jax.vmap(steered))(jnp.zeros((0,), jnp.int32))
  hostcall.barrier()
  assert [(x.shape, x.dtype) for x in jax.tree_util.tree_leaves(result)] == [
      ((0,), jnp.int32), ((0,), jnp.bool_), ((0,), jnp.int32),
      ((0,), jnp.int32)]


def test_control_while_loop_makes_no_bar_and_nests_bars_as_a_loop():
  # Its invocations have a site without a bar spec: the drawing listener
  # makes no bar for them (not even a disabled one). A bar traced in its
  # body is nested, as in any other chunked loop.
  from hostcall._apps.progress import bars as bars_module
  before = set(bars_module.bars._bars)
  out = io.StringIO()

  def body(c):
    return hostcall.progress.scan(lambda d, _: (d + 1, None), c, length=3,
                                  file=out, desc="in steered")[0]
  result = jax.jit(lambda: control.while_loop(
      lambda c: c < 9, body, 0, every=1, time_limit=3600.0))()
  hostcall.barrier()
  assert int(result.value) == 9 and not bool(result.stopped)
  new = set(bars_module.bars._bars) - before
  assert len(new) == 3  # the nested scan's three invocations, nothing else
  sites = {k[0] for k in new}
  (spec,) = [loops_module.invocations.spec(s) for s in sites]
  assert spec.desc == "in steered" and spec.position == 1


# --- Ctrl-C, for real: SIGINT to a subprocess ----------------------------------

_INTERRUPTED_LOOP = """
    import signal, sys, threading, jax, jax.numpy as jnp, numpy as np, hostcall
    # Ctrl-C as an interactive Python has it, also where the tests run in
    # the background (a shell's "&" starts them with SIGINT ignored, and a
    # child inherits that: the second Ctrl-C then went nowhere).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from hostcall import host_callback as hcb
    from hostcall._apps.control import controls

    def step(c, i):
      c = jnp.sin(c) * 0.5 + 1.0
      # One line when the loop is under way: the parent's cue for Ctrl-C.
      jax.lax.cond(i == 5000, lambda: hcb.id_tap(
          lambda *_: print("started", flush=True), 0, delivery="async"),
          lambda: 0)
      return c, None

    def say_when_taken():
      while controls.interrupts() == 0:
        threading.Event().wait(0.01)
      print("taken", flush=True)

    threading.Thread(target=say_when_taken, daemon=True).start()
    n = 10**9   # far more than runs before the parent's Ctrl-C
    run = jax.jit(lambda x: hostcall.progress.fori_loop(
        0, n, lambda i, c: step(c, i)[0], x, every=EVERY,
        interruptible=True, disable=True))
    out = run(jnp.zeros(64))
    steps = int(out.steps)
    ref = jax.lax.fori_loop(0, steps, lambda i, c: jnp.sin(c) * 0.5 + 1.0,
                            jnp.zeros(64))
    hostcall.barrier()
    print("result", bool(out.stopped), hostcall.control.reason_name(
        out.reason), steps > 5000, steps < n, steps % EVERY == 0,
        bool(np.array_equal(out.value, ref)), flush=True)
    """


def _start(code, env=None):
  return subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, cwd=ROOT,
      env={**os.environ, **(env or {})})


def test_ctrl_c_stops_the_loop_and_the_call_returns_its_state():
  proc = _start(_INTERRUPTED_LOOP.replace("EVERY", "20_000"))
  try:
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert proc.returncode == 0, err[-3000:]
  assert out.split() == ["taken", "result", "True", "interrupted", "True",
                         "True", "True", "True"]


def test_a_second_ctrl_c_raises_keyboard_interrupt_as_before():
  # Checks a couple of seconds apart: the second Ctrl-C comes while the
  # loop still runs towards its next check.
  proc = _start(_INTERRUPTED_LOOP.replace("EVERY", "2_000_000"))
  try:
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGINT)   # taken: the loop stops at its check
    assert proc.stdout.readline().strip() == "taken"
    proc.send_signal(signal.SIGINT)   # not taken: Python's KeyboardInterrupt
    out, err = proc.communicate(timeout=120)
  finally:
    proc.kill()
  assert "KeyboardInterrupt" in err, err[-3000:]
  assert "result" not in out


def test_on_the_python_callback_route_time_limits_and_predicates_stop():
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
      import io, warnings, jax, jax.numpy as jnp, hostcall
      warnings.simplefilter("ignore")
      assert not hostcall.queue_stats()["native"]
      out = jax.jit(lambda: hostcall.control.while_loop(
          lambda c: c < 10**9, lambda c: c + 1, 0, every=1000,
          stop_when=lambda s: s.steps >= 5000))()
      print(int(out.steps), hostcall.control.reason_name(out.reason))
      out = jax.jit(lambda: hostcall.control.while_loop(
          lambda c: c < 2**31 - 2, lambda c: c + 1, 0, every=10_000,
          time_limit=0.2))()
      print(bool(out.stopped), hostcall.control.reason_name(out.reason))
      hostcall.barrier()
      """)], capture_output=True, text=True, cwd=ROOT, timeout=300,
      env={**os.environ, "HOSTCALL_NATIVE": "0"})
  assert proc.returncode == 0, proc.stderr[-3000:]
  steps, *rest = proc.stdout.split()
  assert steps in ("5000", "6000") and rest == ["stop_when", "True",
                                                "time_limit"]


def test_a_check_waits_for_its_chunks_results():
  # XLA runs a side-effecting call as early as its operands allow: a check
  # that did not read the chunk's results would ask before the chunk ran,
  # and with a predicate wait for the host on every chunk.
  jaxpr = jax.make_jaxpr(lambda x: hostcall.progress.scan(
      _step, x, length=100, every=10, disable=True,
      stop_when=lambda status: False))(jnp.float32(1.0))

  def find(jaxpr, name):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == name:
        yield jaxpr, eqn
      for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else [param]:
          inner = getattr(sub, "jaxpr", sub)
          if hasattr(inner, "eqns"):
            yield from find(inner, name)

  def waits_for_a_loop(body, check):
    # Walk the waiting operand back to what produced it: a loop.
    producers = {v: e for e in body.eqns for v in e.outvars}
    pending, seen = [check.invars[2]], set()
    while pending:
      var = pending.pop()
      eqn = producers.get(var)
      if eqn is None or id(eqn) in seen:
        continue
      seen.add(id(eqn))
      if eqn.primitive.name in ("scan", "while"):
        return True
      pending.extend(v for v in eqn.invars if not hasattr(v, "val"))
    return False

  checks = list(find(jaxpr.jaxpr, "hostcall_control_check"))
  assert len(checks) == 1  # in the chunk loop
  for body, check in checks:
    assert waits_for_a_loop(body, check), (
        "a check's operands do not wait for its loop")


@pytest.mark.parametrize("steered", [False, True])
def test_loops_carry_prng_keys(steered):
  def step(carry, _):
    key, total = carry
    key, sub = jax.random.split(key)
    return (key, total + jax.random.normal(sub)), total

  init = (jax.random.key(0), jnp.float32(0.0))
  options = dict(time_limit=3600.0) if steered else {}
  out = jax.jit(lambda: hostcall.progress.scan(
      step, init, length=50, every=7, file=io.StringIO(), **options))()
  hostcall.barrier()
  (key, total), ys = out.value if steered else out
  (want_key, want_total), want_ys = jax.lax.scan(step, init, length=50)
  np.testing.assert_array_equal(jax.random.key_data(key),
                                jax.random.key_data(want_key))
  np.testing.assert_array_equal(total, want_total)
  np.testing.assert_array_equal(ys, want_ys)


def test_while_loops_carry_prng_keys():
  def body(carry):
    i, key, total = carry
    key, sub = jax.random.split(key)
    return i + 1, key, total + jax.random.normal(sub)

  init = (0, jax.random.key(1), jnp.float32(0.0))
  out = jax.jit(lambda: hostcall.progress.while_loop(
      lambda c: c[0] < 30, body, init, every=4, file=io.StringIO(),
      time_limit=3600.0))()
  hostcall.barrier()
  want = jax.lax.while_loop(lambda c: c[0] < 30, body, init)
  assert int(out.steps) == 30 and not bool(out.stopped)
  np.testing.assert_array_equal(out.value[2], want[2])
