"""A metrics writer added through the public interface alone: a
``hostcall.metrics.Writer`` subclass, defined here, passed in
``Run(writers=[...])``, that keeps rows in its own storage (an SQLite
database) and reads them back from there. Under ``jit``, ``vmap`` and
``hostcall.scan(every=K)`` every row arrives once, at its exact step.

Nothing here imports hostcall's private modules (see docs/architecture.md,
"Adding a writer")."""

import json
import sqlite3
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import metrics


class SqliteWriter(metrics.Writer):
  """One database row per logged row and metric: (step, member, device,
  name, value as JSON), committed at every flush."""

  def __init__(self, path):
    self.path = path
    self._db = sqlite3.connect(path, check_same_thread=False)
    self._db.execute("CREATE TABLE rows (step INTEGER, member INTEGER, "
                     "device INTEGER, name TEXT, value TEXT)")
    self._lock = threading.Lock()  # write: writer thread; flush: the caller
    self.calls = {"write": 0, "flush": 0, "close": 0}

  def write(self, block):
    assert self.calls["close"] == 0, "write after close"
    self.calls["write"] += 1
    n = len(block)
    member = block.member if block.member is not None else [None] * n
    device = block.device if block.device is not None else [None] * n
    rows = [(int(block.step[i]), _int(member[i]), _int(device[i]), name,
             json.dumps(np.asarray(values[i]).tolist()))
            for name, values in block.metrics.items() for i in range(n)]
    with self._lock:
      self._db.executemany("INSERT INTO rows VALUES (?, ?, ?, ?, ?)", rows)

  def flush(self):
    self.calls["flush"] += 1
    with self._lock:
      self._db.commit()

  def close(self):
    self.calls["close"] += 1
    self.flush()
    with self._lock:
      self._db.close()


def _int(value):
  return None if value is None else int(value)


def read_back(path):
  """What the writer stored, read from its own database (another
  connection): {(step, member, name): value}, refusing duplicates."""
  with sqlite3.connect(path) as db:
    rows = db.execute("SELECT step, member, name, value FROM rows").fetchall()
  stored = {}
  for step, member, name, value in rows:
    key = (step, member, name)
    assert key not in stored, f"row {key} stored twice"
    stored[key] = json.loads(value)
  return stored


def test_a_user_writer_gets_every_row_under_jit_vmap_and_scan(tmp_path):
  steps, members, every = 11, 3, 4  # the last chunk is partial
  writer = SqliteWriter(tmp_path / "rows.db")
  run = metrics.Run("sqlite", root=tmp_path, writers=[writer])

  def body(w, i):
    loss = (w - i) ** 2
    run.log(i, loss=loss, pair=jnp.stack([w, 2 * w]))
    return w + 1.0, loss

  f = jax.jit(jax.vmap(lambda w: hostcall.scan(
      body, w, jnp.arange(steps), every=every)[1]))
  w0 = jnp.arange(members, dtype=jnp.float32) * 10
  losses = np.asarray(f(w0))
  hostcall.barrier()
  assert writer.calls["flush"] >= 1
  stored = read_back(writer.path)  # committed by the barrier's flush
  expected = {}
  for m in range(members):
    for i in range(steps):
      w = float(w0[m]) + i
      expected[(i, m, "loss")] = float(losses[m, i])
      expected[(i, m, "pair")] = [w, 2 * w]
  assert stored == expected  # every value is exact in float32
  run.close()
  assert writer.calls["close"] == 1
  assert read_back(writer.path) == stored


def test_a_user_writer_counts_steps_exactly_over_many_calls(tmp_path):
  writer = SqliteWriter(tmp_path / "rows.db")
  run = metrics.Run("count", root=tmp_path, writers=[writer, "memory"])
  every = 5

  def body(c, _):
    run.log(acc=c)  # steps numbered by the run: 0, 1, 2, ...
    return c + 1, None

  f = jax.jit(lambda c: hostcall.scan(body, c, length=13, every=every)[0])
  calls = 20
  for k in range(calls):
    f(jnp.int32(100 * k))
  jax.jit(lambda: run.log(acc=-1))()  # and one outside any loop
  run.close()
  stored = read_back(writer.path)
  values = [100 * k + i for k in range(calls) for i in range(13)] + [-1]
  assert stored == {(s, None, "acc"): v for s, v in enumerate(values)}
  # The run's other writer got the same rows.
  assert [r["acc"] for r in run.records()] == values
  assert writer.calls["close"] == 1


def test_a_user_writer_failing_is_reported_and_the_run_logs_on(tmp_path):
  class Failing(metrics.Writer):
    def write(self, block):
      raise OSError("disk full")

  writer = SqliteWriter(tmp_path / "rows.db")
  run = metrics.Run("failing", root=tmp_path, writers=[Failing(), writer])
  jax.jit(lambda: [run.log(i, x=i) for i in range(3)])()
  with pytest.raises(hostcall.CallbackException):
    hostcall.barrier()
  jax.jit(lambda: run.log(3, x=3))()
  run.close()
  with pytest.raises(hostcall.CallbackException):
    hostcall.barrier()
  assert read_back(writer.path) == {(i, None, "x"): i for i in range(4)}
