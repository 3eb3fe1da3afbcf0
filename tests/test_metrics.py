"""hostcall.metrics: values logged from compiled code, read back from each writer."""

import json
import os
import struct
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import metrics


def _train(run, steps=50, every=None):
  """A small jitted loop that logs three metrics a step; returns what it
  logged, computed without hostcall."""
  def step(state, x):
    i, w = state
    loss = (w * x - 1.0) ** 2
    w = w - 0.05 * 2 * (w * x - 1.0) * x
    run.log(i, loss=loss, w=w, pair=jnp.stack([loss, w]))
    return (i + 1, w), (loss, w)

  xs = jnp.linspace(0.5, 1.5, steps)
  if every is None:
    loop = lambda: jax.lax.scan(step, (0, jnp.float32(0.0)), xs)
  else:
    loop = lambda: hostcall.scan(step, (0, jnp.float32(0.0)), xs, every=every)
  _, (losses, ws) = jax.jit(loop)()
  return np.asarray(losses), np.asarray(ws)


def _check_rows(rows, losses, ws):
  assert [r["step"] for r in rows] == list(range(len(losses)))
  np.testing.assert_array_equal(np.float32([r["loss"] for r in rows]), losses)
  np.testing.assert_array_equal(np.float32([r["w"] for r in rows]), ws)


def test_jsonl_rows_are_complete_at_the_barrier(tmp_path):
  run = metrics.Run("fit", root=tmp_path)
  losses, ws = _train(run)
  hostcall.barrier()  # no close: the barrier flushes
  lines = (tmp_path / "fit" / "metrics.jsonl").read_text().splitlines()
  rows = [json.loads(line) for line in lines]
  _check_rows(rows, losses, ws)
  assert rows[0].keys() == {"step", "loss", "w", "pair"}
  np.testing.assert_array_equal(np.float32([r["pair"] for r in rows]),
                                np.stack([losses, ws], 1))
  run.close()


def test_buffered_loop_writes_whole_chunks_in_order(tmp_path):
  writes = []

  class Counting(metrics.Writer):
    def write(self, block):
      writes.append(block.step.tolist())

  run = metrics.Run("chunks", root=tmp_path, writers=["jsonl", Counting()])
  losses, ws = _train(run, steps=50, every=16)
  run.close()
  # The writer thread may join chunks that wait for it into one write, but
  # never splits one: every write ends where a chunk ends.
  assert [step for write in writes for step in write] == list(range(50))
  assert {write[-1] + 1 for write in writes} <= {16, 32, 48, 50}
  _check_rows(metrics.read(tmp_path / "chunks").to_dict("records"), losses,
              ws)


def test_the_writer_joins_waiting_blocks_with_the_same_columns(tmp_path):
  import threading
  from hostcall._apps import writer_thread
  entered, release, writes = threading.Event(), threading.Event(), []

  class Held(metrics.Writer):
    def write(self, block):
      entered.set()
      release.wait(60)  # the first write holds the writer thread
      writes.append((list(block.metrics), block.step.tolist(),
                     [v.tolist() for v in block.metrics.values()]))

  run = metrics.Run("joined", root=tmp_path, writers=[Held()])
  loss = jax.jit(lambda i: run.log(i, loss=i * 1.5))
  acc = jax.jit(lambda i: run.log(i, acc=i > 2))
  pair = jax.jit(lambda i: run.log(i, loss=jnp.stack([i, i]) * 1.0))
  try:
    loss(0)
    assert entered.wait(60)
    for i, log in enumerate([loss, acc, acc, loss, loss, pair, loss], 1):
      log(i)
    writer = writer_thread._writer_thread
    # Every put is queued behind the held write; then let it go.
    poll = threading.Event()
    for _ in range(12_000):  # up to a minute
      if writer._pending_blocks >= 8:
        break
      poll.wait(0.005)
    assert writer._pending_blocks == 8 and not writes
    release.set()
    run.close()
  finally:
    release.set()
  assert writes == [
      (["loss"], [0], [[0.0]]),
      (["loss"], [1], [[1.5]]),  # the next is not a loss
      (["acc"], [2, 3], [[False, True]]),
      (["loss"], [4, 5], [[6.0, 7.5]]),
      (["loss"], [6], [[[6.0, 6.0]]]),  # the same name, another shape
      (["loss"], [7], [[10.5]]),
  ]


def test_csv_has_a_column_per_array_element_and_widens(tmp_path):
  run = metrics.Run("table", root=tmp_path, writers=["csv"])
  losses, ws = _train(run, steps=5)
  run.log(7, late=3.5)  # a metric first seen after rows were written
  run.close()
  text = (tmp_path / "table" / "metrics.csv").read_text().splitlines()
  assert text[0] == "step,loss,w,pair[0],pair[1],late"
  assert text[-1] == "7,,,,,3.5"
  rows = metrics.read(tmp_path / "table" / "metrics.csv")
  _check_rows(rows.iloc[:5].to_dict("records"), losses, ws)
  np.testing.assert_array_equal(np.float32(rows["pair[1]"][:5]), ws)


def _tfrecords(path):
  """The records of a TensorBoard event file (TFRecord framing)."""
  data = path.read_bytes()
  offset = 0
  while offset < len(data):
    (length,) = struct.unpack("<Q", data[offset:offset + 8])
    yield data[offset + 12:offset + 12 + length]
    offset += 12 + length + 4


def test_tensorboard_event_files_hold_every_value(tmp_path):
  pytest.importorskip("tensorboardX")
  from tensorboardX.proto import event_pb2
  run = metrics.Run("tb", root=tmp_path, writers=["tensorboard"])
  losses, ws = _train(run, steps=12)
  run.close()
  scalars, histograms = {}, set()
  (events,) = (tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*")
  for record in _tfrecords(events):
    event = event_pb2.Event.FromString(record)
    for value in event.summary.value:
      if value.HasField("histo"):
        histograms.add((value.tag, event.step))
      else:
        scalars[(value.tag, event.step)] = value.simple_value
  np.testing.assert_array_equal(
      np.float32([scalars[("loss", i)] for i in range(12)]), losses)
  np.testing.assert_array_equal(
      np.float32([scalars[("w", i)] for i in range(12)]), ws)
  assert histograms == {("pair", i) for i in range(12)}


def test_memory_writer_gives_a_dataframe_with_vmap_members():
  run = metrics.Run("ensemble", writers=["memory"])

  def fit(w0):
    def step(w, i):
      run.log(i, w=w)
      return w * 0.5, None
    return jax.lax.scan(step, w0, jnp.arange(3))[0]

  jax.jit(jax.vmap(fit))(jnp.array([8.0, 16.0]))
  frame = run.dataframe()
  assert list(frame.columns) == ["step", "member", "w"]
  assert frame.to_dict("list") == {
      "step": [0, 0, 1, 1, 2, 2], "member": [0, 1, 0, 1, 0, 1],
      "w": [8.0, 16.0, 4.0, 8.0, 2.0, 4.0]}
  run.close()


def test_nested_vmap_members_are_numbered_row_major():
  run = metrics.Run("grid", writers=["memory"])
  values = jnp.arange(6.0).reshape(2, 3)
  jax.vmap(jax.vmap(lambda v: run.log(0, v=v)))(values)
  frame = run.dataframe()
  assert frame["member"].tolist() == list(range(6))
  assert frame["v"].tolist() == values.ravel().tolist()
  run.close()


def test_vmap_in_a_buffered_loop_orders_rows_by_step_then_member():
  run = metrics.Run("vb", writers=["memory"])

  def fit(w0):
    def step(w, i):
      run.log(i, w=w)
      return w + 1.0, None
    return hostcall.scan(step, w0, jnp.arange(5), every=2)[0]

  jax.vmap(fit)(jnp.array([0.0, 10.0]))
  records = run.records()
  assert [(r["step"], r["member"], r["w"]) for r in records] == [
      (s, m, 10.0 * m + s) for s in range(5) for m in range(2)]
  run.close()


def test_steps_numbered_on_the_host_when_not_given():
  run = metrics.Run("auto", writers=["memory"])
  f = jax.jit(lambda x: run.log(loss=x))
  for value in (3.0, 2.0, 1.0):
    f(value)
  assert [(r["step"], r["loss"]) for r in run.records()] == [
      (0, 3.0), (1, 2.0), (2, 1.0)]
  run.close()


def test_grad_logs_primal_values_once():
  run = metrics.Run("grad", writers=["memory"])

  def loss(w):
    value = (w - 3.0) ** 2
    run.log(0, loss=value, w=w)
    return value

  assert float(jax.jit(jax.grad(loss))(1.0)) == -4.0
  assert run.records() == [{"step": 0, "loss": 4.0, "w": 1.0}]
  run.close()


def test_every_dtype_is_written(tmp_path):
  run = metrics.Run("dtypes", root=tmp_path, writers=["jsonl", "memory"])
  run.log(1, b=True, i8=np.int8(-3), u32=np.uint32(7), f16=np.float16(0.5),
          bf16=jnp.bfloat16(1.5), c64=np.complex64(3 + 4j), nan=np.nan,
          inf=-np.inf)
  run.close()
  (row,) = metrics.read(tmp_path / "dtypes").to_dict("records")
  assert row["b"] == 1 and row["i8"] == -3 and row["u32"] == 7
  assert row["f16"] == 0.5 and row["bf16"] == 1.5 and row["c64"] == 5.0
  assert np.isnan(row["nan"]) and row["inf"] == -np.inf


def test_a_failing_writer_does_not_lose_the_others_rows(tmp_path):
  class Broken(metrics.Writer):
    def write(self, block):
      raise OSError("disk full")

  run = metrics.Run("broken", root=tmp_path, writers=[Broken(), "jsonl"])
  run.log(0, x=1.0)
  with pytest.raises(hostcall.CallbackException, match="disk full"):
    hostcall.barrier()
  run.close()
  assert metrics.read(tmp_path / "broken").to_dict("records") == [
      {"step": 0, "x": 1.0}]


def test_bad_input_is_explained(tmp_path):
  run = metrics.Run("bad", root=tmp_path)
  with pytest.raises(TypeError, match="metric 'name': expected a JAX or "
                     "NumPy array or a Python number, got 'adam'"):
    run.log(0, name="adam")
  with pytest.raises(TypeError, match="step must be one integer"):
    run.log(0.5, loss=1.0)
  with pytest.raises(TypeError, match="at least one metric"):
    run.log(0)
  with pytest.raises(ValueError, match="a metrics writer is one of "
                     r"\['csv', 'jsonl', 'memory', 'tensorboard'\]"):
    metrics.Run("bad2", root=tmp_path, writers=["parquet"])
  run.close()
  with pytest.raises(RuntimeError, match="is closed"):
    run.log(0, loss=1.0)
  with pytest.raises(FileNotFoundError, match="no run at"):
    metrics.read(tmp_path / "missing")


@pytest.mark.parametrize("native", ["1", "0"], ids=["native", "python"])
def test_rows_are_written_at_exit(tmp_path, native):
  script = textwrap.dedent(f"""
      import jax, jax.numpy as jnp, hostcall
      run = hostcall.metrics.Run("exit", root={str(tmp_path)!r})
      def step(i, _):
        run.log(i, value=i * 2)
        return i + 1, None
      jax.jit(lambda: jax.lax.scan(step, 0, length=1000))()
      # no barrier, no close: the exit hook writes the rows
  """)
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True,
                        text=True, timeout=120,
                        env=dict(os.environ, HOSTCALL_NATIVE=native))
  assert proc.returncode == 0, proc.stderr
  rows = metrics.read(tmp_path / "exit").to_dict("records")
  assert rows == [{"step": i, "value": 2 * i} for i in range(1000)]


def test_plot_writes_a_png_per_run(tmp_path):
  pytest.importorskip("matplotlib")
  run = metrics.Run("plotted", root=tmp_path)
  _train(run, steps=20)
  run.close()
  out = metrics.plot(tmp_path / "plotted")
  assert out == tmp_path / "plotted" / "metrics.png"
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  other = metrics.plot(run, tmp_path / "loss.png", metrics=["loss"])
  assert other.stat().st_size > 1000
  with pytest.raises(ValueError, match="no scalar metrics"):
    empty = metrics.Run("empty", root=tmp_path, writers=["jsonl"])
    empty.log(0, v=jnp.ones(3))
    empty.close()
    metrics.plot(tmp_path / "empty")
