"""Reliability under attack: odd dtypes, odd exceptions, re-entrancy,
signals, failing writers, odd names, a tampered cache. Crashes and hangs are
tried in subprocesses with a timeout; data loss by reading every row back."""

import json
import os
import pathlib
import signal
import shutil
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax

import hostcall
from hostcall import host_callback as hcb, metrics
from hostcall._runtime import native_queue
from tests.helpers import run_python

ROOT = pathlib.Path(__file__).parent.parent


EVERY_DTYPE = [
    jnp.bool_, jnp.int2, jnp.uint2, jnp.int4, jnp.uint4, jnp.int8, jnp.uint8,
    jnp.int16, jnp.uint16, jnp.int32, jnp.uint32, jnp.float4_e2m1fn,
    jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.float8_e4m3b11fnuz,
    jnp.float8_e4m3fnuz, jnp.float8_e5m2fnuz, jnp.float8_e3m4,
    jnp.float8_e4m3, jnp.float8_e8m0fnu, jnp.bfloat16, jnp.float16,
    jnp.float32, jnp.complex64,
]


def _values(dtype, n=7):
  return (jnp.arange(n) % 3).astype(dtype)


# --- 1. every dtype crosses; the consumer never dies ---------------------------

@pytest.mark.parametrize("delivery", ["sync", "async"])
def test_every_dtype_crosses_a_tap(delivery):
  for dtype in EVERY_DTYPE:
    for shape in [(7,), (0,), (3, 1, 2)]:
      x = jnp.resize(_values(dtype), shape).astype(dtype)
      got = []
      jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(a), x,
                                   delivery=delivery))(x)
      hostcall.barrier()
      assert got[0].dtype == x.dtype and got[0].shape == x.shape, dtype
      assert got[0].tobytes() == np.asarray(x).tobytes(), dtype


def test_every_dtype_crosses_the_python_callback_route():
  names = [np.dtype(d).name for d in EVERY_DTYPE]
  run_python(f"""
      import jax, jax.numpy as jnp, numpy as np, hostcall
      from hostcall import host_callback as hcb
      assert not hostcall.queue_stats()["native"]
      for name in {names!r}:
        x = (jnp.arange(7) % 3).astype(name)
        got = []
        jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(a), x,
                                     delivery="async"))(x)
        hostcall.barrier()
        assert got[0].tobytes() == np.asarray(x).tobytes(), name
      """, env={"HOSTCALL_NATIVE": "0"})


def test_every_dtype_is_logged_and_read_back(tmp_path):
  run = metrics.Run("dtypes", root=tmp_path, writers=["jsonl", "memory"])
  values = {np.dtype(d).name: _values(d, 2) for d in EVERY_DTYPE}

  def step(i):
    run.log(i, **{k: v[i] for k, v in values.items()})

  jax.jit(lambda: [step(i) for i in range(2)])()
  hostcall.barrier()
  rows = hostcall.metrics.read(run.dir).to_dict("records")
  assert len(rows) == 2
  for name, v in values.items():
    expected = (np.abs(np.asarray(v)) if np.dtype(name) == np.complex64
                else np.asarray(v).astype(np.float32))
    np.testing.assert_array_equal([r[name] for r in rows], expected,
                                  err_msg=name)
  run.close()


def test_a_failing_delivery_never_kills_the_consumer(monkeypatch):
  from hostcall._runtime import tap_queue as asynchronous
  got = []
  f = jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(int(a)), x,
                                   delivery="async"))
  f(0)
  hostcall.barrier()
  real_get = asynchronous.sites.get
  calls = []

  def broken_once(site):
    calls.append(site)
    if len(calls) == 1:
      raise KeyError("a site the consumer cannot read")
    return real_get(site)

  monkeypatch.setattr(asynchronous.sites, "get", broken_once)
  f(1)
  f(2)
  with pytest.raises(hcb.CallbackException, match="cannot read"):
    hostcall.barrier()
  monkeypatch.undo()
  f(3)
  hostcall.barrier()
  assert got == [0, 2, 3]


def test_any_rank_and_many_leaves_cross_asynchronously():
  got = []
  deep = jnp.arange(3.0).reshape((1,) * 20 + (3,))
  many = [jnp.full((2,), i) for i in range(300)]
  jax.jit(lambda d, m: hcb.id_tap(lambda a, t: got.append(a), (d, m),
                                  delivery="async"))(deep, many)
  hostcall.barrier()
  d, m = got[0]
  assert d.shape == deep.shape and len(m) == 300
  assert [int(v[0]) for v in m] == list(range(300))


# --- 2. exceptions the runtime cannot carry ------------------------------------

ODD_EXCEPTIONS = {
    "surrogate": "raise ValueError(os.fsdecode(b'caf\\xe9.txt'))",
    "str raises": "raise BadStr('x')",
    "nul": "raise ValueError('before\\x00after')",
    "surrogate in a chained cause":
        "raise ValueError('outer') from OSError(os.fsdecode(b'\\xff'))",
}


@pytest.mark.parametrize("flavour", ["pure_callback", "io_callback", "call",
                                     "debug_callback"])
def test_odd_exceptions_never_crash_the_process(flavour):
  staged = {
      "pure_callback": "hostcall.pure_callback(host, jax.ShapeDtypeStruct((), "
                       "jnp.float32), x)",
      "io_callback": "hostcall.io_callback(host, jax.ShapeDtypeStruct((), "
                     "jnp.float32), x)",
      "call": "hcb.call(host, x, result_shape=x)",
      "debug_callback": "hostcall.debug_callback(host, x) or x",
  }[flavour]
  proc = run_python(f"""
      import os, jax, jax.numpy as jnp, hostcall
      from hostcall import host_callback as hcb
      class BadStr(Exception):
        def __str__(self):
          raise RuntimeError("no text for you")
      bodies = {ODD_EXCEPTIONS!r}
      for name, body in bodies.items():
        ns = dict(globals())
        exec("def host(*a):\\n  " + body, ns)
        host = ns["host"]
        f = jax.jit(lambda x: {staged})
        try:
          with hostcall.original_errors():
            f(1.0)
        except (ValueError, BadStr) as exc:
          text = hostcall._runtime.errors.safe_str(exc)
          print(name, "->", type(exc).__name__, repr(text))
        else:
          raise AssertionError(name + ": no error")
        try:
          f(1.0)
        except Exception as exc:
          assert "\\\\x00" in str(exc) or "after" not in str(exc) or \\
              "before" in str(exc), str(exc)[-300:]
      print("alive")
      """)
  out = proc.stdout
  assert out.strip().endswith("alive")
  assert "surrogate -> ValueError 'caf\\\\udce9.txt'" in out
  assert "nul -> ValueError 'before\\\\x00after'" in out
  assert "str raises -> BadStr" in out


def test_a_nul_byte_does_not_cut_the_message():
  def host(v):
    raise ValueError("before\x00after")
  with pytest.raises(Exception) as info:
    jax.jit(lambda x: hostcall.pure_callback(
        host, jax.ShapeDtypeStruct((), jnp.float32), x))(1.0)
  assert "before\\x00after" in str(info.value)
  assert isinstance(hostcall.original_error(info.value), ValueError)


def test_original_errors_gives_the_exception_itself():
  class Missing(KeyError):
    pass

  def lookup(k):
    raise Missing("no such key", int(k))

  f = jax.jit(lambda k: hostcall.pure_callback(
      lookup, jax.ShapeDtypeStruct((), jnp.int32), k))
  with pytest.raises(Missing) as info:
    with hostcall.original_errors():
      f(7)
  assert info.value.args == ("no such key", 7)
  assert isinstance(info.value.__context__, jax.errors.JaxRuntimeError)
  frames = [f.name for f in __import__("traceback").extract_tb(
      info.value.__traceback__)]
  assert "lookup" in frames


def _assert_fails():
  assert False  # noqa: B011 - an AssertionError without a message


def _raise_bare():
  raise NotImplementedError


def _raise_two_lines():
  raise ValueError("two\nlines\n")


def _raise_stop():
  raise StopIteration(3)


@pytest.mark.parametrize("raiser, kind", [
    (_assert_fails, AssertionError), (_raise_bare, NotImplementedError),
    (_raise_two_lines, ValueError), (_raise_stop, StopIteration)])
def test_original_errors_gives_back_empty_and_odd_messages(raiser, kind):
  f = jax.jit(lambda x: hostcall.pure_callback(
      lambda v: raiser(), jax.ShapeDtypeStruct((), jnp.float32), x))
  with pytest.raises(kind) as info:
    with hostcall.original_errors():
      f(1.0)
  assert raiser.__name__ in [frame.name for frame in __import__(
      "traceback").extract_tb(info.value.__traceback__)]


def test_a_failure_of_jaxs_own_callback_is_not_taken_for_hostcalls():
  def ours(v):
    raise ValueError("index 3")

  def theirs(v):
    raise ValueError("index 3")

  spec = jax.ShapeDtypeStruct((), jnp.float32)
  with pytest.raises(Exception):
    jax.jit(lambda x: hostcall.pure_callback(ours, spec, x))(1.0)
  with pytest.raises(Exception) as info:
    jax.jit(lambda x: jax.pure_callback(theirs, spec, x))(1.0)
  assert hostcall.original_error(info.value) is None


# --- 3. re-entrant asynchronous delivery ---------------------------------------

@pytest.mark.parametrize("native", ["1", "0"])
def test_reentrant_asynchronous_taps_make_progress(native):
  proc = run_python("""
      import jax, jax.numpy as jnp, hostcall
      from hostcall import host_callback as hcb
      hostcall.set_queue_capacity(1 << 16)
      run = hostcall.metrics.Run("reentrant", root="/tmp/hostcall-reentrant",
                                 writers=["memory"])
      inner_seen = []
      inner = jax.jit(lambda x: jax.lax.fori_loop(0, 20, lambda i, c: (
          hcb.id_tap(lambda a, t: inner_seen.append(1), c + i,
                     delivery="async"), c)[1], x))
      outer_seen = []
      def outer(a, t):
        outer_seen.append(1)
        inner(jnp.full((4096,), a[0]))   # 16 KiB a tap, the queue 64 KiB
        run.log(len(outer_seen), v=a[0])
      f = jax.jit(lambda x: jax.lax.fori_loop(0, 30, lambda i, c: (
          hcb.id_tap(outer, c + i, delivery="async"), c)[1], x))
      f(jnp.zeros((4096,)))
      hostcall.barrier()
      print(len(outer_seen), len(inner_seen), len(run.records()))
      """, timeout=120, env={"HOSTCALL_NATIVE": native})
  assert proc.stdout.split() == ["30", "600", "30"]


@pytest.mark.parametrize("native", ["1", "0"])
def test_a_host_function_waiting_on_another_thread_makes_progress(native):
  # The asynchronous host function runs a tapping computation through a
  # worker thread while the queue is full: it waits in concurrent.futures,
  # not in JAX.
  proc = run_python("""
      import concurrent.futures, jax, jax.numpy as jnp, hostcall
      from hostcall import host_callback as hcb
      hostcall.set_delivery("async")
      hostcall.set_queue_capacity(1 << 16)
      pool = concurrent.futures.ThreadPoolExecutor(1)
      inner_seen, outer_seen = [], []
      inner = jax.jit(lambda x: jax.lax.scan(lambda c, _: (
          hcb.id_tap(lambda v, t: inner_seen.append(1), c + 1.0), None), x,
          None, length=50)[0])
      def outer(v, t):
        outer_seen.append(1)
        if len(outer_seen) == 1:
          pool.submit(lambda: jax.block_until_ready(
              inner(jnp.zeros(4096)))).result()
      f = jax.jit(lambda x: jax.lax.scan(lambda c, i: (c, hcb.id_tap(
          outer, jnp.full(4096, i, jnp.float32))), x, jnp.arange(50))[0])
      f(0.0)
      hostcall.barrier()
      print(len(outer_seen), len(inner_seen))
      """, timeout=120, env={"HOSTCALL_NATIVE": native})
  assert proc.stdout.split() == ["50", "50"]


def test_a_queued_call_python_cannot_read_is_reported_and_released(
    monkeypatch):
  import ctypes
  got = []
  f = jax.jit(lambda x: hcb.id_tap(lambda a, t: got.append(int(a[0])),
                                   jnp.full((1000,), x), delivery="async"))
  f(0)
  hostcall.barrier()
  real, real_block = ctypes.string_at, native_queue._new_block

  def out_of_memory(address, size):
    monkeypatch.setattr(ctypes, "string_at", real)
    raise MemoryError()

  def no_buffer(size):
    # The one buffer for a batch's items: each is then read alone.
    monkeypatch.setattr(native_queue, "_new_block", real_block)
    raise MemoryError()

  monkeypatch.setattr(ctypes, "string_at", out_of_memory)
  monkeypatch.setattr(native_queue, "_new_block", no_buffer)
  f(1)
  with pytest.raises(hcb.CallbackException,
                     match=r"could not be read into Python \(MemoryError"):
    hostcall.barrier()
  assert hostcall.queue_stats()["queued_bytes"] == 0
  f(2)
  hostcall.barrier()
  assert got == [0, 2]


def test_barrier_waits_for_taps_made_by_asynchronous_host_functions():
  inner_seen = []
  inner = jax.jit(lambda x: hcb.id_tap(lambda a, t: inner_seen.append(1), x,
                                       delivery="async"))

  def outer(a, t):
    inner(a)

  f = jax.jit(lambda x: lax.fori_loop(0, 50, lambda i, c: (
      hcb.id_tap(outer, c + i, delivery="async"), c)[1], x))
  f(jnp.zeros(3))
  hostcall.barrier()
  assert len(inner_seen) == 50


# --- 4, 8. writers that fail, at any time --------------------------------------

class _Raising(metrics.Writer):
  def __init__(self, exc):
    self.exc = exc

  def write(self, block):
    raise self.exc


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(),
                                 OSError(28, "No space left on device")])
def test_a_writer_that_raises_anything_never_hangs_the_barrier(exc, tmp_path):
  run = metrics.Run("raising", root=tmp_path,
                    writers=[_Raising(exc), "jsonl"])
  jax.jit(lambda: [run.log(i, v=i * 1.0) for i in range(5)])()
  with pytest.raises(hcb.CallbackException):
    hostcall.barrier()
  assert [r["v"] for r in metrics.read(run.dir).to_dict("records")] == [
      0.0, 1.0, 2.0, 3.0, 4.0]
  jax.jit(lambda: run.log(9, v=9.0))()
  with pytest.raises(hcb.CallbackException):
    hostcall.barrier()   # the writer thread is alive: it raised again
  run.close()


def test_one_run_failing_at_exit_costs_the_others_nothing(tmp_path):
  run_python(f"""
      import jax, hostcall
      from hostcall import metrics
      class FullDisk(metrics.Writer):
        def write(self, block):
          pass
        def close(self):
          raise OSError(28, "No space left on device")
      bad = metrics.Run("bad", root={str(tmp_path)!r}, writers=[FullDisk()])
      good = metrics.Run("good", root={str(tmp_path)!r})
      f = jax.jit(lambda i: (bad.log(i, v=i), good.log(i, v=i)))
      for i in range(2000):
        f(i)
      """)  # exits without a barrier: the exit hook writes the rows
  rows = metrics.read(tmp_path / "good")
  assert rows["step"].tolist() == list(range(2000))


# --- 6. signals ----------------------------------------------------------------

@pytest.mark.parametrize("handler", ["sys.exit(7)", "raise KeyboardInterrupt"])
def test_a_signal_handler_that_exits_during_a_tap_stops_the_program(handler):
  child = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(f"""
          import signal, sys, time, jax, jax.numpy as jnp
          from hostcall import host_callback as hcb
          def on_term(*_):
            {handler}
          signal.signal(signal.SIGTERM, on_term)
          def slow(a, t):
            if int(a) == 3:
              print("ready", flush=True)
            time.sleep(0.05)
          jax.jit(lambda: jax.lax.fori_loop(0, 10**6, lambda i, c: (
              hcb.id_tap(slow, i), c)[1], 0))()
          print("finished the loop", flush=True)
          """)],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  assert child.stdout.readline().strip() == "ready"
  child.send_signal(signal.SIGTERM)
  out, err = child.communicate(timeout=60)
  assert child.returncode != 0
  assert "finished the loop" not in out
  assert ("SystemExit" in err) if "exit" in handler else (
      "KeyboardInterrupt" in err)


def test_asynchronous_taps_are_written_when_sigterm_exits(tmp_path):
  out = tmp_path / "taps.txt"
  child = subprocess.Popen(
      [sys.executable, "-c", textwrap.dedent(f"""
          import faulthandler, signal, sys, time, jax, jax.numpy as jnp
          import hostcall
          from hostcall import host_callback as hcb
          signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
          sink = open({str(out)!r}, "w")
          f = jax.jit(lambda x: jax.lax.fori_loop(0, 1000, lambda i, c: (
              hcb.id_tap(lambda a, t: sink.write(f"{{int(a)}}\\n"), c + i,
                         delivery="async"), c)[1], x))
          for _ in range(3):
            f(0)
          print("ready", flush=True)
          # A hang on the way out shows every thread's stack.
          faulthandler.dump_traceback_later(50, exit=True)
          # Not signal.pause(): a SIGTERM that comes before the pause
          # starts (the parent sends it on "ready") would leave it waiting
          # for good; a sleep ends, and the handler runs after it.
          while True:
            time.sleep(0.05)
          """)],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  assert child.stdout.readline().strip() == "ready"
  child.send_signal(signal.SIGTERM)
  _, err = child.communicate(timeout=120)
  assert child.returncode == 0, err[-8000:]
  assert out.read_text().split() == [str(i) for i in range(1000)] * 3


# --- 7, 9, 12, 18. metrics: names, runs, files ---------------------------------

ODD_NAMES = ["acc%", "top-1 (%)", "a%%b", "%s%d", 'quote"d', "new\nline",
             "tab\tbed", "ünïcödé", "comma,name", "back\\slash", "{braces}",
             "", " "]


@pytest.mark.parametrize("writer", ["jsonl", "csv", "memory"])
def test_any_metric_name_round_trips(writer, tmp_path):
  run = metrics.Run("names", root=tmp_path, writers=[writer])
  values = {name: float(i) for i, name in enumerate(ODD_NAMES)}
  jax.jit(lambda: run.log(0, **values))()
  rows = run.records()
  assert len(rows) == 1
  for name, value in values.items():
    assert rows[0][name] == value, name
  run.close()
  if writer != "memory":
    assert metrics.read(run.dir).to_dict("records")[0][ODD_NAMES[0]] == 0.0


def test_tensorboard_takes_any_metric_name(tmp_path):
  run = metrics.Run("tb", root=tmp_path, writers=["tensorboard"])
  jax.jit(lambda: run.log(0, **{"acc%": 1.0, "new\nline": 2.0}))()
  hostcall.barrier()
  run.close()
  assert list((run.dir / "tensorboard").glob("events.*"))


def test_colliding_csv_columns_are_an_error_not_a_corrupt_file(tmp_path):
  run = metrics.Run("clash", root=tmp_path, writers=["csv", "memory"])
  jax.jit(lambda: run.log(0, **{"w": jnp.ones(2), "w[0]": 5.0}))()
  with pytest.raises(hcb.CallbackException, match="another metric already"):
    hostcall.barrier()
  assert len(run.records()) == 1  # the other writer has the row
  run.close()


@pytest.mark.parametrize("name", ["../../escape", "/abs/path", "a/../../b",
                                  "", "nul\0byte", 3])
def test_run_names_cannot_write_outside_their_root(name, tmp_path):
  with pytest.raises(ValueError, match="run name"):
    metrics.Run(name, root=tmp_path / "runs")
  assert not (tmp_path / "escape").exists()


def test_run_name_through_a_symbolic_link_outside_root_is_refused(tmp_path):
  (tmp_path / "runs").mkdir()
  (tmp_path / "outside").mkdir()
  (tmp_path / "runs" / "link").symlink_to(tmp_path / "outside")
  with pytest.raises(ValueError, match="symbolic link"):
    metrics.Run("link/x", root=tmp_path / "runs")
  run = metrics.Run("nested/name", root=tmp_path / "runs")
  assert run.dir == tmp_path / "runs" / "nested" / "name"
  run.close()


def test_a_recreated_run_takes_over_and_never_corrupts_its_file(tmp_path):
  old = metrics.Run("exp", root=tmp_path)
  step = jax.jit(lambda i: old.log(i, v=i * 1.0))   # compiled for `old`
  step(0)
  hostcall.barrier()
  # The cell run again, asking to take over the run's files (by default a
  # second run of a name gets a folder of its own: test_metrics_runs.py).
  new = metrics.Run("exp", root=tmp_path, exists="overwrite")
  for i in range(1, 4):
    step(i)
  jax.jit(lambda: new.log(9, v=9.0))()
  hostcall.barrier()
  text = (tmp_path / "exp" / "metrics.jsonl").read_text()
  assert "\0" not in text
  rows = [json.loads(line) for line in text.splitlines()]
  assert [r["step"] for r in rows] == [1, 2, 3, 9]
  assert old.records() == new.records()
  new.close()


def test_open_runs_do_not_cost_a_thread_each(tmp_path):
  before = threading.active_count()
  runs = [metrics.Run(f"r{i}", root=tmp_path) for i in range(50)]
  for run in runs:
    jax.jit(lambda: run.log(0, v=1.0))()
  hostcall.barrier()
  assert threading.active_count() <= before + 1
  for run in runs:
    run.close()


def test_a_row_cut_off_by_a_killed_process_is_skipped_and_said(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 0, "v": 1.0}\n{"step": 1, "v": 2.0}\n{"step": 2, "v')
  with pytest.warns(metrics.IncompleteRowsWarning, match="1 incomplete row"):
    frame = metrics.read(path)
  assert frame["step"].tolist() == [0, 1]
  csv_path = tmp_path / "metrics.csv"
  csv_path.write_text("step,v\r\n0,1.0\r\n1,2.0\r\n2,3.")
  with pytest.warns(metrics.IncompleteRowsWarning):
    frame = metrics.read(csv_path)
  assert frame["step"].tolist() == [0, 1]


def test_rows_are_logged_once_under_checkpoint_and_grad(tmp_path):
  for loop in ("lax.scan", "hostcall.scan"):
    run = metrics.Run(f"remat-{loop}", root=tmp_path, writers=["memory"])

    @jax.checkpoint
    def step(w, i):
      run.log(i, w=w)
      return jnp.sin(w) * 1.5, None

    scan = jax.lax.scan if loop == "lax.scan" else (
        lambda f, c, xs: hostcall.scan(f, c, xs, every=2))
    jax.grad(lambda w: scan(step, w, jnp.arange(5))[0])(0.3)
    assert [r["step"] for r in run.records()] == [0, 1, 2, 3, 4], loop
    run.close()


# --- 10, 13. loop-buffered delivery --------------------------------------------

def test_ctrl_c_in_an_asynchronous_chunk_does_not_drop_its_other_taps():
  seen = []

  def tap(a, t):
    seen.append(int(a))
    if int(a) == 3:
      raise KeyboardInterrupt

  def step(c, _):
    hcb.id_tap(tap, c, delivery="async")
    return c + 1, None

  jax.jit(lambda: hostcall.scan(step, 0, length=8, every=8))()
  with pytest.raises(hcb.CallbackException, match="KeyboardInterrupt"):
    hostcall.barrier()
  assert seen == list(range(8))


def test_asynchronous_taps_in_hostcall_scan_stay_asynchronous():
  threads, release = [], threading.Event()

  def tap(a, t):
    threads.append(threading.current_thread().name)
    release.wait(10)

  def step(c, _):
    hcb.id_tap(tap, c, delivery="async")
    return c + 1, None

  out = jax.jit(lambda: hostcall.scan(step, 0, length=4, every=2))()
  assert int(out[0]) == 4   # returned while the host function still waits
  release.set()
  hostcall.barrier()
  assert threads == ["hostcall-consumer"] * 4


# --- 14. bars belong to their invocation ---------------------------------------

def test_a_failing_loop_in_one_thread_leaves_another_threads_bar_alone():
  import io
  out_ok, out_bad = io.StringIO(), io.StringIO()
  started, failed = threading.Event(), threading.Event()

  def pause(v):
    if int(v) == 5:
      started.set()
      failed.wait(10)
    return v

  ok_loop = jax.jit(lambda: hostcall.progress.scan(
      lambda c, _: (hostcall.pure_callback(
          pause, jax.ShapeDtypeStruct((), jnp.int32), c) + 1, None), 0,
      length=20, file=out_ok, desc="ok"))

  def boom(v):
    raise RuntimeError("stop")

  bad_loop = jax.jit(lambda: hostcall.progress.scan(
      lambda c, _: (hostcall.pure_callback(
          boom, jax.ShapeDtypeStruct((), jnp.int32), c), None), 0,
      length=20, file=out_bad, desc="bad"))
  worker = threading.Thread(target=ok_loop)
  worker.start()
  assert started.wait(30)
  with pytest.raises(Exception, match="stop"):
    bad_loop()
  failed.set()
  worker.join(30)
  hostcall.barrier()
  assert "20/20" in out_ok.getvalue() and "stopped" not in out_ok.getvalue()
  assert "stopped" in out_bad.getvalue()


def test_concurrent_calls_of_one_jitted_loop_get_a_bar_each():
  import io
  out = io.StringIO()
  loop = jax.jit(lambda x: hostcall.progress.scan(
      lambda c, _: (c + x, None), 0.0, length=200, file=out, desc="loop",
      every=1)[0])
  threads = [threading.Thread(target=lambda: loop(1.0)) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  hostcall.barrier()
  finals = [line for line in out.getvalue().replace("\r", "\n").splitlines()
            if "200/200" in line]
  assert len(finals) >= 2 and "stopped" not in out.getvalue()


# --- 16. the queue's bound ------------------------------------------------------

@pytest.mark.parametrize("bad", [2**63, 2**70, -1, 0, 100, 1.5e6, "64MiB",
                                 True])
def test_the_queue_capacity_is_validated(bad):
  before = hostcall.queue_stats()["capacity"]
  with pytest.raises(ValueError, match="from 65536 .* to 2\\*\\*62; got"):
    hostcall.set_queue_capacity(bad)
  assert hostcall.queue_stats()["capacity"] == before


@pytest.mark.parametrize("given", [np.int64(1 << 20), np.uint32(1 << 20)])
def test_the_queue_capacity_takes_any_integer(given):
  before = hostcall.queue_stats()["capacity"]
  try:
    hostcall.set_queue_capacity(given)
    assert hostcall.queue_stats()["capacity"] == 1 << 20
  finally:
    hostcall.set_queue_capacity(before)


# --- 19. the native extension ---------------------------------------------------

def _native_probe(extension, home):
  """What an asynchronous tap says when hostcall's extension is the file
  ``extension`` (a stand-in for a damaged install), twice, and whether a
  synchronous tap still runs."""
  proc = run_python(f"""
      import jax, hostcall
      from hostcall import host_callback as hcb
      from hostcall._runtime import libraries
      libraries.extension_path = lambda: __import__("pathlib").Path(
          {str(extension)!r})
      seen = []
      jax.jit(lambda x: hcb.id_tap(lambda v, t: seen.append(int(v)), x))(3)
      print(seen)
      for attempt in range(2):
        try:
          jax.jit(lambda x: hcb.id_tap(lambda v, t: None, x,
                                       delivery="async"))(3)
        except libraries.HostcallNativeError as exc:
          print(type(exc).__name__, exc)
      """, env={"HOSTCALL_NATIVE": "1", "HOME": str(home)})
  return proc.stdout


def _foreign_library() -> str:
  """A shared library that loads and holds none of hostcall's symbols."""
  import ctypes.util
  name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
  for folder in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                 "/lib64", "/usr/lib64", "/lib", "/usr/lib"):
    if name and os.path.exists(os.path.join(folder, name)):
      return os.path.join(folder, name)
  pytest.skip("no libm or libc file to stand in for a foreign library")


@pytest.mark.parametrize("damage", ["empty", "foreign"])
def test_an_extension_that_does_not_load_is_a_clear_error(tmp_path, damage):
  # Nothing is rebuilt or written at run time: a damaged install (an empty
  # file, as a full disk leaves, or a library without hostcall's functions,
  # as an older build would lack a new one) means an error that names the
  # file and the fix, at each use of the queue; synchronous taps still run.
  from hostcall._runtime import libraries
  installed = libraries.extension_path()
  if installed is None:
    pytest.skip("hostcall's native extension is not installed")
  home = tmp_path / "home"
  home.mkdir()
  extension = tmp_path / installed.name
  if damage == "empty":
    extension.write_bytes(b"")
  else:
    shutil.copy(_foreign_library(), extension)
  before = sorted(tmp_path.rglob("*"))
  out = _native_probe(extension, home).splitlines()
  assert out[0] == "[3]" and len(out) == 3 and out[1] == out[2]
  said = out[1]
  assert said.startswith("HostcallNativeError hostcall: the native tap "
                         "queue is not available: ")
  assert f" loading {extension}: " in said
  assert ("reinstalling hostcall builds it again (`pip install .`, or "
          "`pip install -e .` in a source tree)") in said
  assert sorted(tmp_path.rglob("*")) == before
