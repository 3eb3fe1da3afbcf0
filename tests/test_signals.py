"""Signals and forks, for real: SIGINT and SIGTERM sent with os.kill to a
subprocess that prints a marker where it waits for one, with the device
reaching the native queue and stop states through their FFI handlers and
through JAX's callbacks (HOSTCALL_NATIVE=0, a platform without them)."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import pytest

import hostcall
from hostcall import host_callback as hcb
from hostcall._apps.control import controls

ROOT = pathlib.Path(__file__).parent.parent

QUEUES = pytest.mark.parametrize("native", ["1", "0"], ids=["ffi",
                                                            "callbacks"])


def _start(code: str, native: str) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
      env={**os.environ, "HOSTCALL_NATIVE": native})


def _signal_at_cues(proc, signo, cues=("ready", "started")) -> list[str]:
  """The lines ``proc`` prints, sending it ``signo`` after each line that
  ends with a cue; a process still running after a minute is killed, a
  failure."""
  deadline = threading.Timer(60, proc.kill)
  deadline.start()
  lines = []
  try:
    for line in proc.stdout:
      lines.append(line.strip())
      if lines[-1].endswith(cues):
        os.kill(proc.pid, signo)
    proc.wait()
  finally:
    deadline.cancel()
    if proc.poll() is None:
      proc.kill()
  if proc.returncode == -signal.SIGKILL:
    pytest.fail(f"the process hung; it printed {lines}")
  return lines


# --- Ctrl-C before, during, between and after interruptible loops -------------

_LOOPS = """
    import sys, time, jax, jax.numpy as jnp, numpy as np, hostcall
    from hostcall import host_callback as hcb
    from hostcall._apps.control import controls

    def say(*words):
      print(*words, flush=True)

    def ctrl_c(label):
      # The parent sends SIGINT when it reads "ready".
      state = "installed" if controls.sigint_installed() else "not-installed"
      try:
        say(label, state, "ready")
        time.sleep(60)
        say(label, "no KeyboardInterrupt")
      except KeyboardInterrupt:
        say(label, "KeyboardInterrupt")

    def step(i, c):
      # One line once the loop is under way: the parent's cue for Ctrl-C.
      jax.lax.cond(i == 5000, lambda: hcb.id_tap(
          lambda *_: say("loop started"), 0, delivery="async"), lambda: 0)
      return jnp.sin(c) * 0.5 + 1.0

    def during(every):  # a new trace each time
      out = jax.jit(lambda x: hostcall.progress.fori_loop(
          0, 10**9, step, x, every=every, interruptible=True, disable=True))(
              jnp.zeros(64))
      steps = int(out.steps)  # stopped at a check after the Ctrl-C
      say("during", hostcall.control.reason_name(out.reason),
          steps > 5000 and steps % every == 0)

    def slow(*_):
      time.sleep(0.002)

    def tapping(c, x):
      hcb.id_tap(slow, x, delivery="async")
      return c + 1, None

    ctrl_c("before")
    during(20_000)
    ctrl_c("between")
    # 1,500 taps that take 3 s to deliver: the loop's close comes after them.
    out = jax.jit(lambda: hostcall.progress.scan(
        tapping, 0, jnp.arange(1500), interruptible=True, disable=True))()
    say("returned", int(out.steps), hostcall.control.reason_name(out.reason))
    ctrl_c("after")

    def boom(x):
      if x == 50:
        raise ValueError("boom")
      return x
    try:
      jax.jit(lambda: hostcall.progress.scan(
          lambda c, x: (c + jax.pure_callback(boom, jax.ShapeDtypeStruct(
              (), jnp.int32), x), None), 0, jnp.arange(100, dtype=jnp.int32),
          every=10, interruptible=True, disable=True))()
    except jax.errors.JaxRuntimeError:
      say("failed")
    # The computation's frame is watched, not the signal's arrival.
    deadline = time.monotonic() + 5
    while controls.sigint_installed() and time.monotonic() < deadline:
      time.sleep(0.001)
    ctrl_c("after-failure")
    during(20_001)
    ctrl_c("end")
    """


@QUEUES
def test_ctrl_c_before_during_between_and_after_interruptible_loops(native):
  lines = _signal_at_cues(_start(_LOOPS, native), signal.SIGINT)
  # The library's handler is put back once the failed loop's frame is
  # gone, on either route.
  after_failure = "not-installed"
  assert lines == [
      "before not-installed ready", "before KeyboardInterrupt",
      "loop started", "during interrupted True",
      "between not-installed ready", "between KeyboardInterrupt",
      "returned 1500 None",
      "after not-installed ready", "after KeyboardInterrupt",
      "failed",
      f"after-failure {after_failure} ready", "after-failure KeyboardInterrupt",
      "loop started", "during interrupted True",
      "end not-installed ready", "end KeyboardInterrupt"]


@pytest.mark.parametrize("staged", [True, False], ids=["jit", "eager"])
def test_a_running_loop_keeps_the_handler_when_its_open_was_its_own_call(
    staged):
  # Outside jit the open runs as a computation of its own, which returns
  # before the loop starts: the loop runs on, Ctrl-C is still its.
  seen = []

  def look(i, transforms):
    if int(i) == 5:
      controls._reaper.reap()   # what it would find now, 20 ms on
      seen.append(controls.sigint_installed())

  def loop():
    return hostcall.progress.scan(
        lambda c, i: (hcb.id_tap(look, i) * 0 + c + 1, None), 0,
        jnp.arange(10), every=2, interruptible=True, disable=True)

  before = signal.getsignal(signal.SIGINT)
  out = jax.jit(loop)() if staged else loop()
  assert int(out.steps) == 10 and seen == [True]
  assert not controls.sigint_installed()   # the loop's end put it back
  assert signal.getsignal(signal.SIGINT) is before


# --- SIGTERM: barrier() and sys.exit() in a handler during a tap -------------

@QUEUES
def test_a_sigterm_handler_that_calls_barrier_and_exits(native, tmp_path):
  out = tmp_path / "taps.txt"
  proc = _start(f"""
      import signal, sys, time, jax, hostcall
      from hostcall import host_callback as hcb
      sink = open({str(out)!r}, "w")
      def on_term(*_):
        hostcall.barrier()   # delivers the queued taps
        print("delivered", len(open({str(out)!r}).read().split()),
              flush=True)
        sys.exit(6)
      signal.signal(signal.SIGTERM, on_term)
      def write(a, t):
        time.sleep(0.001)
        sink.write(f"{{int(a)}}\\n"); sink.flush()
      # 1,000 asynchronous taps, about a second's work queued ...
      jax.jit(lambda: jax.lax.fori_loop(0, 1000, lambda i, c: (
          hcb.id_tap(write, i, delivery="async"), c)[1], 0))()
      # ... and a long loop of synchronous taps, interrupted by SIGTERM.
      def slow(a, t):
        if int(a) == 3:
          print("ready", flush=True)
        time.sleep(0.01)
      jax.jit(lambda: jax.lax.fori_loop(0, 10**6, lambda i, c: (
          hcb.id_tap(slow, i), c)[1], 0))()
      print("finished the loop", flush=True)
      """, native)
  lines = _signal_at_cues(proc, signal.SIGTERM)
  assert proc.returncode == 6, proc.stderr.read()[-3000:]
  assert lines == ["ready", "delivered 1000"]
  assert out.read_text().split() == [str(i) for i in range(1000)]


# --- os.fork() while asynchronous taps are in flight -------------------------

@QUEUES
def test_a_forked_child_exits_and_leaves_the_parents_taps_to_it(native,
                                                                tmp_path):
  taps, runs = tmp_path / "taps.txt", tmp_path / "runs"
  proc = _start(f"""
      import atexit, os, sys
      # Registered first, run last: after hostcall's exit hooks. It ends the
      # child with os._exit, as JAX's runtime (not fork-safe) may crash a
      # forked child's interpreter teardown.
      atexit.register(lambda: (print("child exit hooks done", flush=True),
                               os._exit(5)) if os.getpid() != PARENT else None)
      PARENT = os.getpid()
      import time, jax, hostcall
      from hostcall import host_callback as hcb, metrics
      sink = open({str(taps)!r}, "w")
      run = metrics.Run("forked", root={str(runs)!r}, writers=["jsonl"])
      def write(a, t):
        time.sleep(0.002)
        sink.write(f"{{int(a)}}\\n"); sink.flush()
      jax.jit(lambda: jax.lax.fori_loop(0, 1000, lambda i, c: (
          hcb.id_tap(write, i, delivery="async"), run.log(i, v=i), c)[2],
          0))()
      pid = os.fork()   # with most of the taps still queued
      if pid == 0:
        # The parent's run is not the child's: logging, flushing or reading
        # it is refused (never a wait for rows only the parent writes),
        # closing it does nothing.
        for use in (lambda: run.log(1, v=1), run.flush, run.records):
          try:
            use()
          except RuntimeError as exc:
            print("refused:", "is a child forked from it" in str(exc),
                  flush=True)
        run.close()
        sys.exit(3)
      open({str(tmp_path / "child")!r}, "w").write(str(pid))
      _, status = os.waitpid(pid, 0)
      print("child status", os.waitstatus_to_exitcode(status), flush=True)
      hostcall.barrier()
      run.close()
      print("parent done", flush=True)
      """, native)
  try:
    out, err = proc.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    os.kill(int((tmp_path / "child").read_text()), signal.SIGKILL)
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"the forked child hung at exit: {out}")
  assert proc.returncode == 0, err[-3000:]
  assert out.split("\n")[:-1] == ["refused: True"] * 3 + [
      "child exit hooks done", "child status 5", "parent done"]
  assert taps.read_text().split() == [str(i) for i in range(1000)]
  rows = hostcall.metrics.read(runs / "forked")
  assert rows["step"].tolist() == list(range(1000))
