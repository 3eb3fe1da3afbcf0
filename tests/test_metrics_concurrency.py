"""metrics under concurrency and misuse: a run re-created while computations
log to it, a writer slower than the device, a writer that waits, a closed
run still logged to, names that would overwrite hostcall's columns."""

import json
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import host_callback as hcb, metrics
from hostcall._apps.metrics import writer_thread


def test_rows_logged_while_the_run_is_recreated_are_each_kept_once(tmp_path):
  runs = [metrics.Run("race", root=tmp_path, writers=["jsonl", "memory"])]
  first = runs[0]
  f = jax.jit(lambda x: jax.lax.scan(
      lambda c, i: (c, first.log(i, v=c)), x, jnp.arange(200))[0])
  calls = 20
  started = threading.Event()

  def log_in_background():
    for k in range(calls):
      jax.block_until_ready(f(float(k)))
      started.set()

  thread = threading.Thread(target=log_in_background)
  thread.start()
  started.wait()
  for _ in range(5):  # the run made again, mid-flight, over its files
    runs.append(metrics.Run("race", root=tmp_path,
                            writers=["jsonl", "memory"], exists="overwrite"))
  thread.join()
  hostcall.barrier()
  kept = [r for run in runs for r in run.writers[1].records()]
  assert len(kept) == calls * 200
  assert sorted((r["v"], r["step"]) for r in kept) == [
      (float(k), i) for k in range(calls) for i in range(200)]
  # The file holds exactly what the last run was handed, uncorrupted.
  lines = (tmp_path / "race" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line) for line in lines] == runs[-1].writers[1].records()
  runs[-1].close()


def test_a_writer_slower_than_the_device_holds_it_back_not_memory(
    monkeypatch, tmp_path):
  monkeypatch.setattr(writer_thread.WriterThread, "MAX_PENDING_BLOCKS", 8)
  writers = writer_thread.shared
  release = threading.Event()
  pending_seen = []

  class Slow(metrics.Writer):
    def write(self, block):
      release.wait()
      pending_seen.append(writers._pending_blocks)

  run = metrics.Run("slow", root=tmp_path, writers=[Slow(), "memory"])
  # Another run's row between two of this one's, whose rows alternate two
  # sets of columns: each comes as its own block (a run of one site's
  # calls would come as one, and so would a batch's rows of one site with
  # the same columns between other sites' calls).
  other = metrics.Run("other", root=tmp_path, writers=["memory"])
  f = jax.jit(lambda: jax.lax.fori_loop(
      0, 100, lambda i, c: (run.log(i, v=i * 1.0), other.log(i, u=i),
                            run.log(i, w=-i * 1.0), c)[3], 0))
  try:
    f()
    with writers._lock:  # the backlog fills up to its bound, and stays there
      assert writers._room.wait_for(lambda: writers._pending_blocks == 8,
                                    timeout=60)
  finally:
    release.set()
  hostcall.barrier()
  assert max(pending_seen) == 8
  assert [r["step"] for r in run.records()] == list(range(100))
  assert [r["step"] for r in other.records()] == list(range(100))
  run.close()
  other.close()


@pytest.mark.parametrize("wait", ["barrier", "flush"])
def test_a_writer_that_waits_for_the_writers_gets_an_error_not_a_hang(
    wait, tmp_path):
  class Waiting(metrics.Writer):
    def write(self, block):
      hostcall.barrier() if wait == "barrier" else run.flush()

  run = metrics.Run("waiting", root=tmp_path, writers=[Waiting(), "memory"])
  jax.jit(lambda x: run.log(loss=x))(1.0)
  with pytest.raises(hcb.CallbackException,
                     match="called from inside a metrics writer"):
    hostcall.barrier()
  assert run.records() == [{"step": 0, "loss": 1.0}]
  run.writers.pop(0)
  run.close()


def test_rows_logged_to_a_closed_run_are_reported_by_the_next_barrier(
    tmp_path):
  run = metrics.Run("closed", root=tmp_path)
  log = jax.jit(lambda x: run.log(loss=x))   # compiled while open
  log(1.0)
  run.close()
  for value in (2.0, 3.0):
    log(value)
    with pytest.raises(hcb.CallbackException,
                       match="1 row\\(s\\) were logged to .* after it was "
                       "closed"):
      hostcall.barrier()
  rows = (tmp_path / "closed" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(r) for r in rows] == [{"step": 0, "loss": 1.0}]
  with pytest.raises(RuntimeError, match="is closed"):
    run.log(loss=4.0)


def test_a_recreated_run_numbers_the_old_functions_rows_with_its_own(tmp_path):
  old = metrics.Run("steps", root=tmp_path, writers=["memory"])
  f = jax.jit(lambda x: old.log(loss=x))
  f(0.0)
  hostcall.barrier()
  new = metrics.Run("steps", root=tmp_path, writers=["memory"],
                    exists="overwrite")
  g = jax.jit(lambda x: new.log(acc=x))
  for i in range(3):
    f(10.0 + i)
    g(20.0 + i)
  hostcall.barrier()
  assert [r["step"] for r in new.records()] == [0, 1, 2, 3, 4, 5]
  new.close()


def test_step_may_be_given_by_keyword(tmp_path):
  run = metrics.Run("kw", root=tmp_path, writers=["csv", "memory"])
  jax.jit(lambda: jax.lax.scan(
      lambda c, i: (c + 1.0, run.log(step=i, loss=c)), 1.0,
      jnp.arange(10, 13)))()
  hostcall.barrier()
  assert run.records() == [{"step": 10, "loss": 1.0},
                           {"step": 11, "loss": 2.0},
                           {"step": 12, "loss": 3.0}]
  run.close()
  assert (tmp_path / "kw" / "metrics.csv").read_text().splitlines() == [
      "step,loss", "10,1.0", "11,2.0", "12,3.0"]


@pytest.mark.parametrize("name", ["member", "device"])
def test_names_of_hostcalls_columns_are_refused(name, tmp_path):
  run = metrics.Run("reserved", root=tmp_path, writers=["memory"])
  with pytest.raises(ValueError, match=f"\\['{name}'\\] are columns hostcall "
                     "fills itself"):
    jax.vmap(lambda x: run.log(3, **{name: x}))(jnp.arange(3.0))
  run.close()


@pytest.mark.parametrize("step", [np.arange(3), jnp.zeros((2, 2), int), 1.5])
def test_a_step_that_is_not_one_integer_is_refused(step, tmp_path):
  run = metrics.Run("vector-step", root=tmp_path, writers=["memory"])
  with pytest.raises(TypeError, match="step must be one integer"):
    run.log(step, loss=1.0)
  run.close()


def test_a_name_utf8_cannot_carry_is_written_escaped_to_csv(tmp_path):
  run = metrics.Run("odd", root=tmp_path, writers=["csv", "jsonl"])
  name = "loss\udcff"
  jax.jit(lambda: run.log(0, **{name: 1.5}))()
  run.close()
  assert (tmp_path / "odd" / "metrics.csv").read_text().splitlines() == [
      "step,loss\\udcff", "0,1.5"]
  assert metrics.read(tmp_path / "odd" / "metrics.jsonl")[name].tolist() == [
      1.5]


class _FakeRun:
  """What the writer thread hands blocks to (a writer_thread.Sink),
  recorded."""

  def __init__(self):
    self.got = []
    self.tally = self  # what the writer thread reports written puts to
    self.written = 0

  def add(self, count):
    self.written += count

  def write(self, block, count=1):
    resume = block is writer_thread.RESUME
    self.got.append((None if resume else block.step.tolist(), count))
    return 0 if resume else count


def _block(*steps, name="v"):
  return metrics.Block(step=np.array(steps, np.int64),
                       metrics={name: np.zeros(len(steps), np.float32)})


def _drain_through_a_fresh_writer_thread(items):
  writers = writer_thread.WriterThread()
  for item in items:
    writers._queue.put(item)
  writers._pending_blocks = len(items)
  writers._pending_bytes = sum(size for _, _, size in items)
  threading.Thread(target=writers._loop, daemon=True).start()
  with writers._lock:
    assert writers._room.wait_for(lambda: writers._pending_blocks == 0,
                                  timeout=60)
  assert writers._pending_bytes == 0


def test_the_writer_thread_joins_only_neighbours_it_may_and_loses_none():
  a, b = _FakeRun(), _FakeRun()
  resume = writer_thread.RESUME
  _drain_through_a_fresh_writer_thread([
      (a, _block(0), 8), (a, resume, 0),  # a run's writers opening
      (a, _block(1), 8), (a, _block(2, 3), 16),
      (b, _block(4), 8),  # another run
      (a, _block(5, name="w"), 8),  # other columns
      (a, _block(6), 8), (a, _block(7), 8)])
  assert a.got == [([0], 1), (None, 1), ([1, 2, 3], 2), ([5], 1),
                   ([6, 7], 2)]
  assert b.got == [([4], 1)]
  assert (a.written, b.written) == (6, 1)  # each put counted once


def test_blocks_that_cannot_be_joined_are_written_one_by_one(monkeypatch):
  def no_memory(blocks):
    raise MemoryError("joining blocks")

  monkeypatch.setattr("hostcall._apps.metrics.block.concatenate", no_memory)
  run = _FakeRun()
  _drain_through_a_fresh_writer_thread(
      [(run, _block(0), 8), (run, _block(1), 8), (run, _block(2), 8)])
  # Each block is written once, in order, and counted once.
  assert run.got == [([0], 1), ([1], 1), ([2], 1)]
  assert run.written == 3


def _started_writer_thread(monkeypatch, **settings):
  writers = writer_thread.WriterThread()
  for name, value in settings.items():
    monkeypatch.setattr(writers, name, value)
  return writers


def _wait_until(writers, predicate):
  with writers._lock:
    assert writers._room.wait_for(predicate, timeout=60)


def test_small_blocks_gather_and_whoever_waits_never_waits_out_the_window(
    monkeypatch):
  writers = _started_writer_thread(monkeypatch, GATHER_SECONDS=3600.0)
  run = _FakeRun()
  writers.put(run, _block(0))
  poll = threading.Event()
  for _ in range(12_000):  # the writer took it and gathers (up to a minute)
    if writers._gathering:
      break
    poll.wait(0.005)
  assert writers._gathering and run.got == []
  writers.put(run, _block(1, 2))
  with writers.waited_for():  # as a flush, a barrier or a close waits
    _wait_until(writers, lambda: writers._pending_blocks == 0)
  assert run.got == [([0, 1, 2], 2)]  # one write
  assert run.written == 2


def test_a_writes_worth_of_blocks_is_written_without_waiting_out_the_window(
    monkeypatch):
  block = _block(0)
  writers = _started_writer_thread(monkeypatch, GATHER_SECONDS=3600.0,
                                   GATHER_BYTES=3 * block.nbytes)
  run = _FakeRun()
  for step in range(3):
    writers.put(run, _block(step))
  _wait_until(writers, lambda: writers._pending_blocks == 0)
  assert [s for steps, _ in run.got for s in steps] == [0, 1, 2]
  assert run.written == 3


def test_blocks_handed_over_in_one_trip_are_written_once_it_ends(
    monkeypatch):
  # A delivery thread's trip ends (calls.round_ended): no more blocks come
  # before its next, so the writer writes what it has rather than waiting
  # out its window.
  writers = _started_writer_thread(monkeypatch, GATHER_SECONDS=3600.0)
  run = _FakeRun()
  writers.put(run, _block(0))
  writers.put(run, _block(1, 2))
  writers.round_ended()
  _wait_until(writers, lambda: writers._pending_blocks == 0)
  assert run.got == [([0, 1, 2], 2)]  # one write
  writers.round_ended()  # with nothing waiting: nothing to write
  writers.put(run, _block(3))
  writers.round_ended()
  _wait_until(writers, lambda: writers._pending_blocks == 0)
  assert run.got == [([0, 1, 2], 2), ([3], 1)]


@pytest.mark.parametrize("jit", ["jax.jit", "hostcall.jit"])
def test_a_programs_rows_are_written_once_delivered_with_no_one_waiting(
    jit, tmp_path, monkeypatch):
  # The rows a trip of the delivery thread hands over are written while
  # the caller goes on: not at its next barrier, a window later.
  from hostcall._runtime import tap_queue as queue_module
  writers = writer_thread.shared
  monkeypatch.setattr(writers, "GATHER_SECONDS", 3600.0)
  run = metrics.Run("trip", root=tmp_path)
  wrap = jax.jit if jit == "jax.jit" else hostcall.jit
  body = wrap(lambda x: jax.lax.scan(
      lambda c, i: (c + 1.0, run.log(i, loss=c)), x, jnp.arange(40))[0])
  hostcall.barrier()
  tally = run._sink.current().tally
  written = tally.written
  with hostcall.delivery("async"):
    body(jnp.float32(0.5)).block_until_ready()
  jax.effects_barrier()
  assert queue_module.consumer.drain(timeout=60)
  with tally.changed:
    assert tally.changed.wait_for(lambda: tally.written > written,
                                  timeout=60)
  run.close()
  assert metrics.read(tmp_path / "trip")["loss"].tolist() == [
      0.5 + i for i in range(40)]


def test_a_put_waiting_for_room_ends_the_writers_window(monkeypatch):
  # A backlog bound below what the writer gathers: the put that waits for
  # room wakes the writer rather than waiting out its window.
  writers = _started_writer_thread(monkeypatch, GATHER_SECONDS=3600.0,
                                   MAX_PENDING_BLOCKS=2)
  run = _FakeRun()
  done = threading.Event()

  def put_three():
    for step in range(3):
      writers.put(run, _block(step))
    done.set()

  threading.Thread(target=put_three, daemon=True).start()
  assert done.wait(60), "the third put waited out the writer's window"
  with writers.waited_for():
    _wait_until(writers, lambda: writers._pending_blocks == 0)
  assert [s for steps, _ in run.got for s in steps] == [0, 1, 2]
  assert run.written == 3
