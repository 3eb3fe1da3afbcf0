"""A bar's ticks thinned where the device makes them: under ``hostcall.jit``
the native queue drops a tick within a fraction of the bar's
``mininterval`` after the last one it queued (``hostcall_thinned.cc``), the
close carrying the count and the values; every tick still reaches a bar
that draws each (``mininterval=0``), a loop with a ``stop_when``
predicate, ``jax.jit``'s calls and ``HOSTCALL_NATIVE=0``; a loop steered by
a time limit or Ctrl-C alone has its ticks thinned as any bar's."""

from __future__ import annotations

import io
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import progress
from hostcall._apps.loops import invocations as loops_module
from hostcall._apps.progress import bars as bars_module
from tests.helpers import run_python, tqdm_postfix

STEPS = 100  # a tick a step: the default every (1% of the loop)


def _step(carry, _):
  carry = carry + 1.0
  progress.set_postfix(v=carry[0])
  return carry, None


def _bar_program(jit, out, **options):
  return jit(lambda x: progress.scan(_step, x, None, length=STEPS, file=out,
                                     desc="bar", **options)[0])


def _bars(out: io.StringIO) -> list[tuple[str, str]]:
  """``(first render, last render)`` of each closed bar, in order."""
  bars = []
  for line in out.getvalue().split("\n"):
    renders = [r for r in line.split("\r") if r.strip().startswith("bar")]
    if renders:
      bars.append((renders[0], renders[-1]))
  return bars


def _count_and_postfix(render: str) -> tuple[str, str]:
  match = re.search(r"(\d+/\d+) \[[^,\]]*,[^,\]]*(?:, (.*))?\]", render)
  assert match, render
  return match.group(1), match.group(2) or ""


def _pushed() -> int:
  return hostcall.queue_stats()["pushed"]


def _run_bars(run, calls: int) -> tuple[int, float]:
  """Calls ``run`` with ``calls`` inputs (the i-th starting at i); returns
  what the queue took and how long it took."""
  run(jnp.zeros(4, jnp.float32))  # compiled
  hostcall.barrier()
  before, start = _pushed(), time.monotonic()
  for i in range(calls):
    run(jnp.full(4, float(i), jnp.float32))
  hostcall.barrier()
  return _pushed() - before, time.monotonic() - start


def _assert_each_bar_right(out: io.StringIO, calls: int,
                           first_drawn: bool = True) -> None:
  """Each of the last ``calls`` bars closed at 100/100 showing its own
  call's last value (the i-th: i + 100); ``first_drawn``: its line starts
  with its first draw, at 0 (not under jax.jit, whose live opens draw the
  next bars before the queued closes end the earlier ones)."""
  bars = _bars(out)[-calls:]
  assert len(bars) == calls
  for i, (first, last) in enumerate(bars):
    if first_drawn:
      assert _count_and_postfix(first)[0] == f"0/{STEPS}"
    assert _count_and_postfix(last) == (
        f"{STEPS}/{STEPS}", tqdm_postfix(v=float(i + STEPS)))


def test_a_short_bar_under_hostcall_jit_queues_open_and_close_not_each_tick(
    queued):
  out = io.StringIO()
  calls = 50
  pushed, took = _run_bars(_bar_program(hostcall.jit, out), calls)
  # An open and a close a call, and at most one tick each interval (a
  # quarter of the default mininterval), where every tick was 102 a call.
  interval = bars_module.THINNED_TICKS * bars_module.TICK_INTERVAL
  assert 2 * calls <= pushed <= 2 * calls + 2 + took / interval
  assert pushed < 10 * calls
  # The close carries the count and the last step's values: every bar
  # still starts at 0 and ends at 100/100 with its own call's values.
  _assert_each_bar_right(out, calls)


def test_a_tick_is_queued_once_its_interval_has_passed(queued):
  # A bar of two ticks a call, whose mininterval (4 ms) gives an interval
  # of 1 ms: the first tick of a call made 5 ms after the last is queued
  # (the second, right after it, is dropped unless the loop was paused).
  # (The wait is the time the thinning measures, not a synchronisation.)
  out = io.StringIO()
  run = hostcall.jit(lambda x: progress.scan(
      _step, x, None, length=2, file=out, desc="bar", mininterval=0.004)[0])
  jax.block_until_ready(run(jnp.zeros(4, jnp.float32)))
  hostcall.barrier()
  before, calls = _pushed(), 5
  for i in range(calls):
    time.sleep(0.005)
    jax.block_until_ready(run(jnp.full(4, float(i), jnp.float32)))
  hostcall.barrier()
  # Open, first tick, close; the second tick too where the machine
  # paused the loop between them for longer than the interval.
  assert 3 * calls <= _pushed() - before <= 4 * calls
  assert [_count_and_postfix(last) for _, last in _bars(out)[-calls:]] == [
      ("2/2", tqdm_postfix(v=float(i + 2))) for i in range(calls)]


@pytest.mark.parametrize("options", [{"interruptible": True},
                                     {"time_limit": 3600.0}],
                         ids=["interruptible", "time_limit"])
def test_a_loop_steered_without_a_predicate_has_its_ticks_thinned(
    options, queued):
  # Its checks are answered by the stop state alone, which no tick feeds:
  # its bar's ticks are thinned as any bar's, and its result and its bar
  # are each call's own.
  out = io.StringIO()
  run = hostcall.jit(lambda x: progress.scan(
      _step, x, None, length=STEPS, file=out, desc="bar", **options))
  calls = 20
  jax.block_until_ready(run(jnp.zeros(4, jnp.float32)))
  hostcall.barrier()
  before = _pushed()
  results = [run(jnp.full(4, float(i), jnp.float32)) for i in range(calls)]
  hostcall.barrier()
  assert _pushed() - before < 10 * calls  # (102 a call, each tick)
  for i, result in enumerate(results):
    assert not bool(result.stopped) and int(result.steps) == STEPS
    np.testing.assert_array_equal(result.value[0],
                                  np.full(4, i + STEPS, np.float32))
  finals = re.findall(r"(\d+)/(\d+) \[", out.getvalue())
  assert finals.count((str(STEPS), str(STEPS))) >= calls


@pytest.mark.parametrize("case", ["mininterval=0", "stop_when", "jax.jit"])
def test_bars_that_need_every_tick_still_queue_each(case, queued):
  out, seen = io.StringIO(), []
  jit, options = hostcall.jit, {}
  if case == "mininterval=0":
    options = {"mininterval": 0}
  elif case == "stop_when":
    options = {"stop_when": lambda status: seen.append(status.steps) or False}
  else:
    jit = jax.jit
  calls = 10
  pushed, _ = _run_bars(_bar_program(jit, out, **options), calls)
  # A tick a step each call (and its close; a bar's queued open).
  assert pushed >= (STEPS + 1) * calls
  if case == "stop_when":
    assert seen == list(range(1, STEPS + 1)) * (calls + 1)
  # (A live open, jax.jit's or a predicate loop's, draws the next bar
  # before the queued close ends the one before.)
  _assert_each_bar_right(out, calls, first_drawn=case == "mininterval=0")


#: What each subprocess's program starts with (``_step``'s twin).
_SUBPROCESS_STEP = """
  import io, re, jax, jax.numpy as jnp, hostcall
  from hostcall import progress

  def step(carry, _):
    carry = carry + 1.0
    progress.set_postfix(v=carry[0])
    return carry, None
"""


def test_without_the_native_handlers_every_tick_is_queued():
  # HOSTCALL_NATIVE=0: hostcall.jit's calls are JAX's Python callbacks,
  # which queue each tick, as before.
  code = _SUBPROCESS_STEP + """

  out = io.StringIO()
  run = hostcall.jit(lambda x: progress.scan(step, x, None, length=100,
                                             file=out, desc="bar")[0])
  run(jnp.zeros(4)); hostcall.barrier()
  before = hostcall.queue_stats()["pushed"]
  for i in range(5):
    run(jnp.full(4, float(i)))
  hostcall.barrier()
  assert not hostcall.queue_stats()["native"]
  print("pushed", hostcall.queue_stats()["pushed"] - before)
  print("ends", out.getvalue().count("100/100"))
  """
  proc = run_python(code, env={"HOSTCALL_NATIVE": "0"})
  assert "pushed 510" in proc.stdout  # 102 a call
  assert "ends 6" in proc.stdout


def test_on_several_devices_each_bar_starts_and_ends_right():
  # Each device's program is lowered apart (a site, a thinning key, a
  # device); the i-th call on each device is the i-th invocation of the
  # loop, one bar (its devices' values the same), as under jax.jit.
  code = _SUBPROCESS_STEP + """

  for name, jit in (("jax.jit", jax.jit), ("hostcall.jit", hostcall.jit)):
    out = io.StringIO()
    run = jit(lambda x: progress.scan(step, x, None, length=100, file=out,
                                      desc="bar")[0])
    before = hostcall.queue_stats()["pushed"]
    for i in range(20):
      for device in jax.devices():
        run(jax.device_put(jnp.full(4, float(i)), device))
    hostcall.barrier()
    pushed = hostcall.queue_stats()["pushed"] - before
    bars = []
    for line in out.getvalue().split("\\n"):
      renders = [r for r in line.split("\\r") if r.startswith("bar")]
      if renders:  # (jax.jit's first draws precede the earlier closes)
        drawn = renders[-1] if jit is jax.jit else renders[0] + renders[-1]
        bars.append(" ".join(re.findall(r"\\d+/100|v=[\\d.]+", drawn)))
    print(name, len(jax.devices()), pushed, bars)
  """
  proc = run_python(
      code, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
  want = [f"100/100 v={i + 100}" for i in range(20)]
  lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
  jax_devices, jax_pushed, jax_bars = lines["jax.jit"].split(" ", 2)
  devices, pushed, bars = lines["hostcall.jit"].split(" ", 2)
  assert jax_devices == devices == "2"
  # (Under jax.jit the two devices' live opens race: on a busy machine
  # its bars may close in another order.)
  assert sorted(eval(jax_bars)) == sorted(want)  # noqa: S307 - our own print
  assert eval(bars) == [f"0/100 {bar}" for bar in want]  # noqa: S307
  assert int(jax_pushed) >= 101 * 40  # each tick and close under jax.jit
  assert int(pushed) < 10 * 40  # hostcall.jit: the opens, closes, a few


@pytest.mark.parametrize("mininterval", [float("inf"), 4e10])
def test_an_endless_mininterval_keeps_the_open_and_the_close(mininterval,
                                                             queued):
  # Past what the handler's nanoseconds count (int64), the interval is a
  # year's: every tick of these calls is dropped, the bars still right.
  out = io.StringIO()
  calls = 5
  pushed, _ = _run_bars(_bar_program(hostcall.jit, out,
                                     mininterval=mininterval), calls)
  assert pushed == 2 * calls
  _assert_each_bar_right(out, calls)
