"""Which invocation a queued bar event belongs to, under ``hostcall.jit``:
the device makes each invocation's handle (``hostcall_new_handle``), which
its queued open carries to the host, so that threads calling one program
at once never mix their bars; a bar whose computation fails is closed,
stopped, by the next barrier, also where that barrier itself delivered the
bar's queued open, but not another thread's bar whose computation still
runs; and a failure ends only the bars its own computation opened (the
device's handle names the thread that runs it; a computation a host
function ran ends none of the computation that runs that host
function). Each case runs side by
side with ``jax.jit``."""

from __future__ import annotations

import io
import itertools
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import progress
from hostcall._apps.loops import invocations as loops_module
from tests.helpers import FirstCallWaits, run_python

JITS = {"jax.jit": jax.jit, "hostcall.jit": hostcall.jit}
STEPS = 50


def _step(carry, _):
  carry = carry + 1
  progress.set_postfix(v=carry)
  return carry, None


def _finals(text: str) -> list[int]:
  """The values the bars closed at their totals showed, each once (a bar
  whose last tick drew its total draws it again as tqdm closes it)."""
  return list(dict.fromkeys(int(v) for v in re.findall(
      rf"{STEPS}/{STEPS} \[[^\]]*v=(\d+)\]", text)))


def _last_render(text: str, desc: str) -> str:
  """The last line the bar ``desc`` drew."""
  return [r.strip() for r in re.split(r"[\r\n]", text)
          if r.strip().startswith(desc)][-1]


class _Opened(loops_module.Listener):
  """The handles of the invocations opened while it listens."""

  def __init__(self):
    self.handles: list[int] = []

  def on_open(self, invocation):
    self.handles.append(invocation.handle)


@pytest.fixture
def opened():
  listener = _Opened()
  loops_module.invocations.listen(listener)
  yield listener
  loops_module.invocations._listeners.remove(listener)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("name", list(JITS))
def test_threads_calling_one_program_each_get_their_own_bar(name, threads,
                                                           opened, queued):
  # Each call's bar ends at its total showing that call's own last value,
  # however the threads' invocations interleave in the queue; none is
  # closed as stopped.
  out = io.StringIO()
  run = JITS[name](lambda x: progress.scan(
      _step, x, None, length=STEPS, every=2, file=out, desc="b")[0])
  jax.block_until_ready(run(jnp.int32(0)))
  hostcall.barrier()
  calls = 20
  start = threading.Barrier(threads)

  def worker(t):
    start.wait()
    for i in range(calls):
      run(jnp.int32(1000 * t + i))

  workers = [threading.Thread(target=worker, args=(t,))
             for t in range(1, threads + 1)]
  for w in workers:
    w.start()
  for w in workers:
    w.join()
  hostcall.barrier()
  want = [STEPS] + [1000 * t + i + STEPS for t in range(1, threads + 1)
                    for i in range(calls)]
  assert sorted(_finals(out.getvalue())) == sorted(want)
  assert "stopped" not in out.getvalue()
  assert len(set(opened.handles)) == len(opened.handles) == len(want)
  if name == "hostcall.jit":  # the device's handles, above the host's
    assert min(opened.handles) >= loops_module.DEVICE_HANDLES
  else:
    assert max(opened.handles) < loops_module.DEVICE_HANDLES


@pytest.mark.parametrize("name", list(JITS))
def test_threads_with_nested_and_vmapped_bars(name, queued):
  # An inner bar each outer step, over vmap lanes: every inner invocation
  # of every thread's call ends at its total, none stopped (under the
  # shared LATEST, a close ended another thread's bar), and the result is
  # the call's own.
  out = io.StringIO()

  def inner(c):
    return progress.scan(_step, c, None, length=STEPS, file=out,
                         desc="b")[0]

  def outer(c, _):
    return jax.vmap(inner)(c) + 1000, None

  run = JITS[name](lambda x: jax.lax.scan(outer, x, None, length=3)[0])
  jax.block_until_ready(run(jnp.zeros(2, jnp.int32)))
  hostcall.barrier()
  threads = [threading.Thread(target=lambda t=t: [
      run(jnp.array([100 * t + i, 100 * t + i + 50], jnp.int32))
      for i in range(5)]) for t in (1, 2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  hostcall.barrier()
  text = out.getvalue()
  assert "stopped" not in text
  # 1 + 10 calls, 3 inner bars each, all closed at their total.
  assert len(re.findall(rf"{STEPS}/{STEPS} ", text)) >= 33
  np.testing.assert_array_equal(run(jnp.array([7, 8], jnp.int32)),
                                [7 + 3 * 1050, 8 + 3 * 1050])


def _failing_step(carry, _):
  def host(c):
    if c >= 45:
      raise ValueError("boom at 45")
    return np.asarray(c, np.int32)
  carry = jax.pure_callback(host, jax.ShapeDtypeStruct((), jnp.int32),
                            carry + 1)
  progress.set_postfix(v=carry)
  return carry, None


def _failing_bar(jit, out):
  """A program whose bar ``bar`` (drawn on ``out``) fails at its 45th step."""
  return jit(lambda x: progress.scan(
      _failing_step, x, None, length=STEPS, desc="bar", file=out)[0])


@pytest.mark.parametrize("name", list(JITS))
def test_a_bar_whose_computation_fails_is_closed_stopped_by_the_barrier(
    name, queued):
  # The barrier after each failed call closes its bar, stopped at a count
  # before the failure (under hostcall.jit, that of the last tick the
  # device queued: thinned, up to a quarter of mininterval earlier), also
  # where the barrier itself delivered the bar's queued open.
  out = io.StringIO()
  run = _failing_bar(JITS[name], out)
  for call in range(3):
    out.seek(0)
    out.truncate()
    with pytest.raises(Exception, match="boom at 45"):
      jax.block_until_ready(run(jnp.int32(0)))
    hostcall.barrier()
    last = _last_render(out.getvalue(), "bar")
    match = re.search(rf"(\d+)/{STEPS} \[[^\]]*stopped\]", last)
    assert match, (call, out.getvalue())
    count = int(match.group(1))
    if name == "jax.jit":
      assert count == 44 and "v=44" in last
    else:
      assert 0 <= count <= 44
  # The next call's bar is its own, not an earlier failure's.
  out = io.StringIO()
  ok = JITS[name](lambda x: progress.scan(
      _step, x, None, length=STEPS, desc="bar", file=out)[0])
  assert int(ok(jnp.int32(3))) == 3 + STEPS
  hostcall.barrier()
  assert _finals(out.getvalue()) == [3 + STEPS]
  assert "stopped" not in out.getvalue()


@pytest.mark.parametrize("name", list(JITS))
def test_a_failed_counter_bar_is_closed_stopped_by_the_barrier(name, queued):
  # A while_loop's bar without a total: no count tells that it stopped
  # short, so the barrier that ends it after its computation failed (a
  # JAX callback raised: nothing of hostcall's saw the failure) marks it
  # stopped, as a bar with a total shows it. A `track` counter that the
  # barrier ends is not stopped.
  out = io.StringIO()
  tracked = progress.track(lambda c: c + 1, desc="tracked", file=out)

  def program(x):
    x = jax.lax.while_loop(lambda c: c < 5, tracked, x)
    return progress.while_loop(lambda c: c < 1000,
                               lambda c: _failing_step(c, None)[0], x,
                               desc="bar", file=out)

  run = JITS[name](program)
  with pytest.raises(Exception, match="boom at 45"):
    jax.block_until_ready(run(jnp.int32(0)))
  hostcall.barrier()
  last = _last_render(out.getvalue(), "bar")
  assert re.search(r"\b\d+step \[[^\]]*v=\d+, stopped\]", last), last
  assert "stopped" not in _last_render(out.getvalue(), "tracked")


def test_a_barrier_marks_stopped_only_what_it_knows_failed():
  # A barrier ends a loop left open; it marks it stopped where the thread
  # that ran its computation is one of Python's (the barrier's own, or
  # one whose frames show it no longer waits for it), not where the
  # runtime ran it on a thread of its own (an asynchronously dispatched
  # program that may still be running).
  class Opened:
    def __init__(self, opener):
      self.opener = opener

  others = {1: None, 2: None}
  assert loops_module._failed(Opened(threading.get_ident()), others)
  assert loops_module._failed(Opened(threading.get_ident()), None)
  assert loops_module._failed(Opened(2), others)
  assert not loops_module._failed(Opened(3), others)
  assert not loops_module._failed(Opened(loops_module.QUEUED), others)


@pytest.mark.parametrize("name", list(JITS))
def test_a_failed_bar_is_closed_by_the_barrier_while_another_thread_queues(
    name, queued):
  # Under hostcall.jit the delivery thread is held while the failed call's
  # open and another thread's calls pile up behind it: the barrier
  # delivers them all and ends the failed bar (opened, by its device,
  # before the barrier began). (Under jax.jit the open is live: a held
  # callback would hold the device, so none is held.)
  gate = threading.Event()
  hold = hostcall.jit(lambda x: jax.debug.callback(
      lambda v: gate.wait(30), x))
  failed_out, other_out = io.StringIO(), io.StringIO()
  failing = _failing_bar(JITS[name], failed_out)
  other = JITS[name](lambda x: progress.scan(
      _step, x, None, length=STEPS, desc="other", file=other_out)[0])
  jax.block_until_ready(other(jnp.int32(0)))
  hostcall.barrier()
  if name == "hostcall.jit":
    hold(jnp.int32(1))
  with pytest.raises(Exception, match="boom at 45"):
    jax.block_until_ready(failing(jnp.int32(0)))
  stop = threading.Event()
  worker = threading.Thread(target=lambda: [
      jax.block_until_ready(other(jnp.int32(i))) for i in range(100000)
      if not stop.is_set()])
  worker.start()
  try:
    gate.set()
    hostcall.barrier()
    last = _last_render(failed_out.getvalue(), "bar")
    assert re.search(rf"\d+/{STEPS} \[[^\]]*stopped\]", last), last
  finally:
    stop.set()
    worker.join()
    hostcall.barrier()


@pytest.mark.parametrize("inner_jit", list(JITS))
@pytest.mark.parametrize("name", list(JITS))
def test_a_host_function_whose_own_computation_fails_leaves_the_outer_bar(
    name, inner_jit, queued):
  # Re-entrant: a step's host function runs a computation of its own,
  # which fails (hostcall's host function raised into it), and catches its
  # error. That failure ends the inner computation's bar, stopped; the
  # outer loop goes on, its bar to its total, never stopped.
  inner_out, outer_out, caught = io.StringIO(), io.StringIO(), []

  def inner_step(c, _):
    def host(c):
      if c >= 5:
        raise ValueError("inner boom")
      return np.asarray(c, np.int32)
    return hostcall.pure_callback(
        host, jax.ShapeDtypeStruct((), jnp.int32), c + 1), None

  inner = JITS[inner_jit](lambda x: progress.scan(
      inner_step, x, None, length=10, desc="inner", file=inner_out)[0])

  def outer_host(c):
    if int(c) == 7:
      with pytest.raises(Exception, match="inner boom") as raised:
        jax.block_until_ready(inner(jnp.int32(0)))
      caught.append(raised.type)
    return np.asarray(c, np.int32)

  def outer_step(c, _):
    c = hostcall.pure_callback(outer_host,
                               jax.ShapeDtypeStruct((), jnp.int32), c + 1)
    progress.set_postfix(v=c)
    return c, None

  outer = JITS[name](lambda x: progress.scan(
      outer_step, x, None, length=STEPS, desc="outer", file=outer_out)[0])
  assert int(outer(jnp.int32(0))) == STEPS
  hostcall.barrier()
  assert len(caught) == 1
  assert _finals(outer_out.getvalue()) == [STEPS]
  assert "stopped" not in outer_out.getvalue()
  assert re.search(r"\d+/10 \[[^\]]*stopped\]",
                   _last_render(inner_out.getvalue(), "inner"))


_RAISING = {"jax": jax.pure_callback, "hostcall": hostcall.pure_callback}


@pytest.mark.parametrize("raising", list(_RAISING))
@pytest.mark.parametrize("name", list(JITS))
def test_a_failing_computation_stops_its_own_bar_not_another_threads(
    name, raising, queued):
  # Thread B's loop waits in a host function, its bar open, when thread
  # A's computation fails. A's bar closes stopped: at once where hostcall's
  # host function raised (the failure ends what its thread's computation
  # opened: under hostcall.jit the thread that made the handle), else at
  # the barrier. B's bar goes on to its total, never stopped.
  wait_once = FirstCallWaits()
  entered, release = wait_once.entered, wait_once.release

  def waiting_step(c, _):
    c = jax.pure_callback(wait_once, jax.ShapeDtypeStruct((), jnp.int32),
                          c + 1)
    progress.set_postfix(v=c)
    return c, None

  def failing_step(c, _):
    def host(c):
      if c >= 10:
        raise ValueError("boom at 10")
      return np.asarray(c, np.int32)
    c = _RAISING[raising](host, jax.ShapeDtypeStruct((), jnp.int32), c + 1)
    progress.set_postfix(v=c)
    return c, None

  a_out, b_out = io.StringIO(), io.StringIO()
  run_a = JITS[name](lambda x: progress.scan(
      failing_step, x, None, length=STEPS, desc="a", file=a_out)[0])
  run_b = JITS[name](lambda x: progress.scan(
      waiting_step, x, None, length=STEPS, desc="b", file=b_out)[0])
  results = []
  worker = threading.Thread(
      target=lambda: results.append(int(run_b(jnp.int32(1000)))))
  worker.start()
  try:
    assert entered.wait(60)
    with pytest.raises(Exception, match="boom at 10"):
      jax.block_until_ready(run_a(jnp.int32(0)))
    assert "stopped" not in b_out.getvalue()
    if raising == "hostcall":
      assert re.search(rf"\d+/{STEPS} \[[^\]]*stopped\]", a_out.getvalue())
  finally:
    release.set()
    worker.join()
  hostcall.barrier()
  assert results == [1000 + STEPS]
  assert _finals(b_out.getvalue()) == [1000 + STEPS]
  assert "stopped" not in b_out.getvalue()
  last = _last_render(a_out.getvalue(), "a")
  assert re.search(rf"\d+/{STEPS} \[[^\]]*v=\d+, stopped\]", last), last


@pytest.mark.parametrize("name", list(JITS))
def test_a_barrier_leaves_another_threads_running_bar_open(name, queued):
  # Thread B's loop waits in a host function when the main thread's
  # barrier runs: the barrier ends the loops that failed computations left
  # open, not B's, whose computation B's thread still waits for. B's bar
  # then goes on to its total, never stopped.
  entered, release = threading.Event(), threading.Event()

  def wait_at_5(c):
    if int(c) == 1005:
      entered.set()
      release.wait(60)
    return np.asarray(c, np.int32)

  def step(c, _):
    c = jax.pure_callback(wait_at_5, jax.ShapeDtypeStruct((), jnp.int32),
                          c + 1)
    progress.set_postfix(v=c)
    return c, None

  out = io.StringIO()
  run = JITS[name](lambda x: progress.scan(
      step, x, None, length=STEPS, desc="b", file=out)[0])
  results = []
  worker = threading.Thread(
      target=lambda: results.append(int(run(jnp.int32(1000)))))
  worker.start()
  try:
    assert entered.wait(60)
    hostcall.barrier()
    assert "stopped" not in out.getvalue()
  finally:
    release.set()
    worker.join()
  hostcall.barrier()
  assert results == [1000 + STEPS]
  assert _finals(out.getvalue()) == [1000 + STEPS]
  assert "stopped" not in out.getvalue()


@pytest.mark.parametrize("name", list(JITS))
def test_a_barrier_ends_the_bar_another_threads_failed_computation_left(
    name, queued):
  # Thread A's computation failed in a JAX callback (nothing told hostcall)
  # and A has moved on: the main thread's barrier closes A's bar, stopped.
  out = io.StringIO()
  run = _failing_bar(JITS[name], out)
  failed, done = threading.Event(), threading.Event()

  def worker():
    try:
      jax.block_until_ready(run(jnp.int32(0)))
    except Exception:  # noqa: BLE001 - the failure this test makes
      failed.set()
    done.wait(60)

  thread = threading.Thread(target=worker)
  thread.start()
  try:
    assert failed.wait(60)
    hostcall.barrier()
    last = _last_render(out.getvalue(), "bar")
    assert re.search(rf"\d+/{STEPS} \[[^\]]*stopped\]", last), last
  finally:
    done.set()
    thread.join()


def test_the_registry_keeps_its_own_handles_below_the_devices():
  registry = loops_module.Invocations()
  site = registry.site(loops_module.NoBarSpec(position=0,
                                              interruptible=False))
  device = jax.devices()[0]
  registry._handles = itertools.count(loops_module.DEVICE_HANDLES - 2)
  made = [registry.open(site, device, None) for _ in range(3)]
  adopted = registry.open(site, device, None,
                          handle=loops_module.DEVICE_HANDLES + 5)
  assert made == [loops_module.DEVICE_HANDLES - 2,
                  loops_module.DEVICE_HANDLES - 1, 1]
  assert adopted == loops_module.DEVICE_HANDLES + 5


def test_without_the_native_handlers_threads_keep_their_bars_apart():
  # HOSTCALL_NATIVE=0: the handle comes from a Python callback (from the
  # same range), the open queued from Python with it.
  code = """
  import io, re, threading, jax, jax.numpy as jnp, hostcall
  from hostcall import progress
  from hostcall._apps.loops import invocations

  def step(c, _):
    c = c + 1
    progress.set_postfix(v=c)
    return c, None

  class Openers(invocations.Listener):
    def __init__(self):
      self.threads = set()
    def on_open(self, invocation):
      self.threads.add(invocation.opener)

  openers = Openers()
  invocations.invocations.listen(openers)
  out = io.StringIO()
  run = hostcall.jit(lambda x: progress.scan(step, x, None, length=50,
                                             every=2, file=out, desc="b")[0])
  print("results", [int(run(jnp.int32(i))) for i in range(3)])
  threads = [threading.Thread(target=lambda t=t: [
      run(jnp.int32(1000 * t + i)) for i in range(15)]) for t in (1, 2, 3)]
  [t.start() for t in threads]
  callers = {threading.get_ident()} | {t.ident for t in threads}
  [t.join() for t in threads]
  hostcall.barrier()
  print("openers", openers.threads == callers)
  assert not hostcall.queue_stats()["native"]
  finals = sorted(int(v) for v in re.findall(r"50/50 \\[[^\\]]*v=(\\d+)", out.getvalue()))
  print("finals", finals == sorted([50, 51, 52] + [1000 * t + i + 50 for t in (1, 2, 3) for i in range(15)]))
  print("stopped", out.getvalue().count("stopped"))
  print("device handles", min(invocations.invocations._latest.values())
        >= invocations.DEVICE_HANDLES)
  """
  proc = run_python(code, env={"HOSTCALL_NATIVE": "0"})
  assert "results [50, 51, 52]" in proc.stdout
  assert "finals True" in proc.stdout
  assert "stopped 0" in proc.stdout
  assert "device handles True" in proc.stdout
  # Each open names the thread that ran its computation (a failure ends
  # only those).
  assert "openers True" in proc.stdout
