"""hostcall.metrics: values logged from compiled code, read back from each writer."""

import json
import os
import struct
import subprocess
import sys
import textwrap
import warnings

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
  from hostcall._apps.metrics import writer_thread
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
    # Every put is queued behind the held write (the queue's thread has
    # delivered every call: a run of one site's calls may come as one
    # block); then let it go.
    from hostcall._runtime import tap_queue as queue_module
    jax.effects_barrier()
    assert queue_module.consumer.drain(timeout=60)
    assert 5 <= writer_thread.shared._pending_blocks <= 8 and not writes
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
  with pytest.raises(TypeError, match="metric 'name': expected a JAX array, "
                     r"a NumPy array of numbers or booleans, a Python "
                     r"number, text \(str\) or a dict of them, got None"):
    run.log(0, name=None)
  with pytest.raises(TypeError, match="step must be one integer"):
    run.log(0.5, loss=1.0)
  with pytest.raises(TypeError, match="at least one metric"):
    run.log(0)
  with pytest.raises(ValueError, match="a metrics writer is one of "
                     r"\['csv', 'jsonl', 'memory', 'mlflow', 'tensorboard', "
                     r"'wandb'\]"):
    metrics.Run("bad2", root=tmp_path, writers=["parquet"])
  run.close()
  with pytest.raises(RuntimeError, match="is closed"):
    run.log(0, loss=1.0)
  with pytest.raises(FileNotFoundError, match="no run at"):
    metrics.read(tmp_path / "missing")


@pytest.mark.parametrize("native", ["1", "0"],
                         ids=["ffi", "jax_callbacks"])  # HOSTCALL_NATIVE
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


@pytest.mark.parametrize("value, dtype", [
    (np.array(["a"]), "<U1"), (np.array([b"a"]), "|S1"),
    (np.array([1.0], dtype=object), "object"), (np.str_("a"), "<U1"),
    (np.array(["2020-01-01"], dtype="datetime64[D]"), r"datetime64\[D\]"),
])
def test_arrays_of_what_is_not_numbers_are_refused_by_name(tmp_path, value,
                                                           dtype):
  # They went through, to fail in JAX: "Error interpreting argument to
  # <function stage> as an abstract array".
  run = metrics.Run("texts", root=tmp_path, writers=["memory"])
  if isinstance(value, str):  # np.str_: a text value, kept as text
    jax.jit(lambda: run.log(0, m=value))()
  else:
    with pytest.raises(TypeError, match=rf"metric 'm': expected a JAX "
                       rf"array, a NumPy array of numbers or booleans, a "
                       rf"Python number, text \(str\) or a dict of them, "
                       rf"got .* of dtype {dtype} \(not numbers\)"):
      jax.jit(lambda: run.log(0, m=value))()
  with pytest.raises(TypeError, match=rf"step must be one integer .*got .*"
                     rf"dtype {dtype}"):
    run.log(value, loss=1.0)
  # The neighbours that send arrays to the host refuse them alike.
  with pytest.raises(TypeError, match=rf"pure_callback: .*a NumPy array of "
                     rf"numbers or booleans, or a Python number; got .* of "
                     rf"dtype {dtype} \(not numbers\)"):
    hostcall.pure_callback(lambda v: v, jax.ShapeDtypeStruct((), "float32"),
                           value)
  run.close()
  assert run.records() == ([{"step": 0, "m": "a"}] if isinstance(value, str)
                           else [])


def test_paths_that_are_not_paths_are_refused_by_name(tmp_path):
  with pytest.raises(TypeError, match=r"the run to read .* is a path \(a str "
                     r"or os.PathLike, e.g. 'runs/fit'\), got 5 of type int"):
    metrics.read(5)
  with pytest.raises(TypeError, match="Run's root is a path .* got None"):
    metrics.Run("r", root=None)


def _truncate_from_outside(path):
  """What logrotate's copytruncate does once it has copied the file."""
  with open(path, "r+b") as f:
    f.truncate(0)


@pytest.mark.parametrize("writer", ["jsonl", "csv"])
def test_a_file_truncated_from_outside_goes_on_with_whole_rows(tmp_path,
                                                               writer):
  run = metrics.Run("rotated", root=tmp_path, writers=[writer])
  log = jax.jit(lambda i: run.log(i, loss=i * 0.5, w=jnp.stack([i, -i])))
  for i in range(5):
    log(i)
  run.flush()
  path = run.dir / f"metrics.{writer}"
  _truncate_from_outside(path)
  for i in range(5, 9):
    log(i)
  run.flush()
  assert b"\0" not in path.read_bytes()
  assert metrics.read(path)["step"].tolist() == [5, 6, 7, 8]
  _truncate_from_outside(path)
  os.truncate(path, 0)  # twice, and by the other spelling
  for i in range(9, 12):
    log(i)
  run.close()
  data = path.read_bytes()
  # The writes after a truncation land at the new end: no hole of NULs
  # where the old offset was.
  assert b"\0" not in data
  if writer == "csv":  # the header again, where the file was found empty
    assert data.decode().splitlines()[0] == "step,loss,w[0],w[1]"
  rows = metrics.read(path).to_dict("records")
  assert [r["step"] for r in rows] == [9, 10, 11]
  assert [r["loss"] for r in rows] == [4.5, 5.0, 5.5]
  w = [list(r["w"]) if writer == "jsonl" else [r["w[0]"], r["w[1]"]]
       for r in rows]
  assert w == [[9, -9], [10, -10], [11, -11]]


@pytest.mark.parametrize("writer", ["jsonl", "csv"])
def test_read_takes_what_rotation_leaves_without_dropping_a_whole_row(
    tmp_path, writer):
  # What a writer that goes on at its old offset (an older hostcall, another
  # tool) leaves after a truncation: NULs, then whole rows; and a copy that
  # starts mid-row. Neither costs a whole row.
  if writer == "jsonl":
    text = ("\0" * 4096 + '{"step": 7, "v": 1.5}\n{"step": 8, "v": 2.5}\n')
    partial = '7, "v": 1.5}\n{"step": 8, "v": 2.5}\n'
  else:
    text = "\0" * 4096 + "step,v\r\n7,1.5\r\n8,2.5\r\n"
    partial = "7,1.5\r\nstep,v\r\n8,2.5\r\n"
  path = tmp_path / f"metrics.{writer}"
  path.write_text(text)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # NULs before rows are no incomplete row
    rows = metrics.read(path).to_dict("records")
  assert rows == [{"step": 7, "v": 1.5}, {"step": 8, "v": 2.5}]
  path.write_text(partial)
  with pytest.warns(metrics.IncompleteRowsWarning, match=r"skipped 1 "
                    r"incomplete row\(s\) \(line\(s\) 1\).*truncated from "
                    "outside"):
    rows = metrics.read(path).to_dict("records")
  assert rows[-1] == {"step": 8, "v": 2.5} and len(rows) == 1


def test_plot_refuses_what_it_cannot_plot_by_name(tmp_path):
  pytest.importorskip("matplotlib")
  run = metrics.Run("p", root=tmp_path)
  jax.jit(lambda: run.log(0, loss=1.0))()
  run.close()
  with pytest.raises(TypeError, match=r"plot's run .* is a path .* got 5 of "
                     "type int"):
    metrics.plot(5)
  with pytest.raises(TypeError, match=r"plot's metrics= is a list of metric "
                     r"names \(str\), e.g. metrics=\['loss'\], got 'loss'"):
    metrics.plot(run.dir, metrics="loss")
  with pytest.raises(ValueError, match=r"no metric 'acc' was logged; plot's "
                     r"metrics= takes names among \['loss'\]"):
    metrics.plot(run.dir, metrics=["acc"])
  with pytest.raises(TypeError, match="log_scale= is True, False or None"):
    metrics.plot(run.dir, log_scale="yes")
  assert not (run.dir / "metrics.png").exists()
  assert metrics.plot(run.dir, metrics=["loss"]).exists()


@pytest.mark.parametrize("step", [2**31, -2**31 - 1, 2**62, np.int64(2**40)])
def test_a_step_beyond_jaxs_integers_is_refused_with_the_range(tmp_path,
                                                               step):
  run = hostcall.metrics.Run("r", root=tmp_path, writers=["memory"])
  with pytest.raises(ValueError, match=r"does not fit JAX's default integer "
                     r"\(int32\).*-2147483648 to 2147483647.*jax_enable_x64"):
    jax.jit(lambda: run.log(step, loss=1.0))()
  jax.jit(lambda: run.log(2**31 - 1, loss=2.0))()  # the largest goes in
  run.close()
  assert run.records() == [{"step": 2**31 - 1, "loss": 2.0}]
