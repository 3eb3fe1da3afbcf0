"""The writers of the tracking tools users already look at: MLflow (read
back with ``MlflowClient`` from a real SQLite tracking store), Weights &
Biases (offline runs, read back with ``wandb leet inspect --json``) and a
CLU ``MetricWriter``; under ``jit``, ``vmap``, ``hostcall.scan(every=K)``
and ``hostcall.progress.scan``, every value at its exact step, and a
failing store reported as a full disk is, the other writers losing
nothing."""

import io
import json
import os
import pathlib
import subprocess
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import metrics, progress
from tests.helpers import FakeCoordinationClient, wandb_records

STEPS, MEMBERS, EVERY = 23, 3, 5  # the last chunk of the scan is partial


def _log_everywhere(run):
  """Logs through ``run`` under jit + vmap + hostcall.scan(every=K), and
  under progress.scan; returns {(key, step): value} of what was logged,
  keyed as the tracking writers key it."""
  def body(w, i):
    loss = (w - i) ** 2
    run.log(i, loss=loss, pair=jnp.stack([w, 2 * w]))
    return w + 1.0, loss

  w0 = jnp.arange(MEMBERS, dtype=jnp.float32) * 10
  losses = np.asarray(jax.jit(jax.vmap(lambda w: hostcall.scan(
      body, w, jnp.arange(STEPS), every=EVERY)[1]))(w0))

  def bar_body(c, i):
    run.log(STEPS + i, acc=c)
    return c * 2, None

  jax.jit(lambda: progress.scan(bar_body, jnp.int32(1), jnp.arange(6),
                                every=4, file=io.StringIO()))()
  expected = {}
  for m in range(MEMBERS):
    for i in range(STEPS):
      w = float(w0[m]) + i
      expected[(f"loss/member_{m}", i)] = float(losses[m, i])
      expected[(f"pair/member_{m}/0", i)] = w
      expected[(f"pair/member_{m}/1", i)] = 2 * w
  for i in range(6):
    expected[("acc", STEPS + i)] = float(2 ** i)
  return expected


# --- MLflow -------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
  """A real SQLite tracking store (its tables made once, for the module)."""
  pytest.importorskip("mlflow", reason="the MLflow writer needs mlflow: pip "
                      "install 'hostcall[mlflow]'")
  from mlflow import MlflowClient
  uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
  MlflowClient(tracking_uri=uri).search_experiments()  # makes the tables
  return uri


@pytest.fixture
def mlflow_client(mlflow_store, monkeypatch, tmp_path):
  from mlflow import MlflowClient
  monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_store)
  monkeypatch.chdir(tmp_path)  # where MLflow would put artifacts
  return MlflowClient(tracking_uri=mlflow_store)


def _mlflow_values(client, run_id):
  """{(key, step): value} of an MLflow run, refusing a value logged twice."""
  got = {}
  for key in client.get_run(run_id).data.metrics:
    for metric in client.get_metric_history(run_id, key):
      assert (key, metric.step) not in got, (key, metric.step)
      got[(key, metric.step)] = metric.value
  return got


def test_mlflow_gets_every_value_at_its_step_in_batches(mlflow_client,
                                                        tmp_path):
  run = metrics.Run("fit", root=tmp_path, writers=["mlflow", "jsonl"],
                    params={"lr": 0.1, "optimizer": "adam"})
  writer = run.writers[0]
  assert isinstance(writer, metrics.MlflowWriter)
  batches = []
  log_batch = writer.client.log_batch

  def counted(run_id, metrics=(), **kwargs):
    batches.append(len(metrics))
    return log_batch(run_id, metrics=metrics, **kwargs)

  writer.client.log_batch = counted
  expected = _log_everywhere(run)
  run.close()
  mlflow_run = mlflow_client.get_run(writer.run_id)
  assert mlflow_run.info.run_name == "fit"
  assert mlflow_run.info.status == "FINISHED"
  assert mlflow_run.data.params == {"lr": "0.1", "optimizer": "adam"}
  assert _mlflow_values(mlflow_client, writer.run_id) == expected
  # One log_batch per block the writer thread handed over, never one per
  # row: the scan brings EVERY steps (of every member) a host call.
  rows = STEPS * MEMBERS + 6
  assert sum(batches) == len(expected)
  assert 1 <= len(batches) <= -(-STEPS // EVERY) + 2 < rows
  assert max(batches) <= metrics.MlflowWriter.BATCH
  # The run's other writer got the same rows.
  assert len(metrics.read(run.dir)) == rows


def test_mlflow_splits_a_large_block_at_its_batch_bound(mlflow_client,
                                                        tmp_path):
  writer = metrics.MlflowWriter("large", experiment="large")
  batches = []
  log_batch = writer.client.log_batch
  writer.client.log_batch = lambda run_id, metrics=(), **kw: (
      batches.append(len(metrics)), log_batch(run_id, metrics=metrics,
                                              **kw))[1]
  writer.write(metrics.Block(step=np.arange(2500),
                             metrics={"x": np.arange(2500.0)}))
  writer.close()
  assert batches == [1000, 1000, 500]
  history = mlflow_client.get_metric_history(writer.run_id, "x")
  assert sorted((m.step, m.value) for m in history) == [
      (i, float(i)) for i in range(2500)]
  experiment = mlflow_client.get_experiment_by_name("large")
  assert mlflow_client.get_run(writer.run_id).info.experiment_id == (
      experiment.experiment_id)


def test_a_batch_refused_midway_says_which_steps_are_not_in_mlflow(
    mlflow_client, tmp_path):
  writer = metrics.MlflowWriter("midway")
  log_batch, calls = writer.client.log_batch, []

  def second_refused(run_id, metrics=(), **kwargs):
    calls.append(len(metrics))
    if len(calls) == 2:
      raise OSError("the store's disk is full")
    return log_batch(run_id, metrics=metrics, **kwargs)

  writer.client.log_batch = second_refused
  with pytest.raises(RuntimeError, match=r"refused the metrics of steps "
                     r"1000 to 2499 \(OSError: the store's disk is full\); "
                     r"1500 metric value\(s\) are not in MLflow run"):
    writer.write(metrics.Block(step=np.arange(2500),
                               metrics={"x": np.arange(2500.0)}))
  writer.close()
  assert calls == [1000, 1000]
  assert len(mlflow_client.get_metric_history(writer.run_id, "x")) == 1000
  assert mlflow_client.get_run(writer.run_id).info.status == "FAILED"


def _failing_store_test(tmp_path, monkeypatch, uri, match):
  monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
  run = metrics.Run("failing", root=tmp_path, writers=["mlflow", "jsonl"])
  assert run.writers[0].run_id is None  # the store refused the run
  jax.jit(lambda: [run.log(i, x=i) for i in range(3)])()
  with pytest.raises(hostcall.CallbackException, match=match):
    hostcall.barrier()
  jax.jit(lambda: run.log(3, x=3))()  # the run logs on
  run.close()
  with pytest.raises(hostcall.CallbackException, match=match):
    hostcall.barrier()
  assert metrics.read(run.dir)["x"].tolist() == [0, 1, 2, 3]


def _make_read_only(path):
  """``path`` read-only: by its mode, or (for root, whom modes do not stop)
  by the immutable attribute; a skip where neither holds."""
  path.chmod(0o444)
  if not os.access(path, os.W_OK):
    return lambda: path.chmod(0o644)
  done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
  if done.returncode != 0:
    pytest.skip("cannot make a file read-only here (root, without chattr "
                f"+i: {done.stderr.decode().strip()})")
  return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_read_only_mlflow_store_is_reported_and_the_others_lose_nothing(
    mlflow_client, tmp_path, monkeypatch):
  from mlflow import MlflowClient
  path = tmp_path / "read-only.db"
  MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
  before = path.read_bytes()
  undo = _make_read_only(path)
  try:
    _failing_store_test(tmp_path, monkeypatch, f"sqlite:///{path}",
                        "could not start a run .*OperationalError")
  finally:
    undo()
  assert path.read_bytes() == before


def test_a_bad_mlflow_uri_is_reported_and_the_others_lose_nothing(
    mlflow_client, tmp_path, monkeypatch):
  _failing_store_test(tmp_path, monkeypatch, "nosuchscheme://tracking",
                      "'nosuchscheme://tracking' could not start a run")


def test_a_store_failing_mid_run_is_reported_and_the_others_lose_nothing(
    mlflow_client, tmp_path):
  import sqlite3
  path = tmp_path / "failing.db"
  run = metrics.Run("mid", root=tmp_path, writers=["jsonl", metrics.MlflowWriter(
      "mid", tracking_uri=f"sqlite:///{path}")])
  writer = run.writers[1]
  jax.jit(lambda: run.log(0, x=0))()
  hostcall.barrier()
  with sqlite3.connect(path) as db:  # the store breaks under the run
    db.execute("DROP TABLE metrics")
  jax.jit(lambda: run.log(1, x=1))()
  with pytest.raises(hostcall.CallbackException,
                     match="refused the metrics of steps 1 to 1"):
    hostcall.barrier()
  run.close()
  assert metrics.read(run.dir)["x"].tolist() == [0, 1]
  from mlflow import MlflowClient
  assert MlflowClient(tracking_uri=f"sqlite:///{path}").get_run(
      writer.run_id).info.status == "FAILED"


# --- Weights & Biases -----------------------------------------------------------

@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
  """W&B offline, its files under tmp_path; returns where they go."""
  pytest.importorskip("wandb", reason="the W&B writer needs wandb: pip "
                      "install 'hostcall[wandb]'")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path))
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.setenv("WANDB_CONSOLE", "off")
  return tmp_path / "wandb"


def _wandb_records(wandb_run):
  """The records of an offline W&B run, as wandb's own reader prints them
  (``wandb leet inspect --json``)."""
  return wandb_records(wandb_run.settings.sync_file)


def _wandb_values(records):
  """{(key, step): value} of the history records, refusing a value logged
  twice."""
  got = {}
  for record in records:
    if record["type"] != "history":
      continue
    step = record["history"]["step"]["num"]
    for key, value in record["history"]["item"].items():
      if key.startswith("_"):
        continue  # W&B's own: _step, _runtime, _timestamp
      assert (key, step) not in got, (key, step)
      got[(key, step)] = value
  return got


def test_wandb_offline_gets_every_value_at_its_step(wandb_offline, tmp_path):
  run = metrics.Run("fit", root=tmp_path, writers=["wandb", "jsonl"],
                    params={"lr": 0.1, "optimizer": "adam"})
  writer = run.writers[0]
  assert isinstance(writer, metrics.WandbWriter)
  expected = _log_everywhere(run)
  run.close()
  records = _wandb_records(writer.run)
  (started,) = [r["run"] for r in records if r["type"] == "run"]
  assert started["display_name"] == "fit"
  config = started["config"]["update"]
  assert (config["lr"], config["optimizer"]) == (0.1, "adam")
  assert _wandb_values(records) == expected
  assert len(metrics.read(run.dir)) == STEPS * MEMBERS + 6


def test_two_wandb_runs_are_two_offline_runs(wandb_offline, tmp_path):
  first = metrics.Run("a", root=tmp_path, writers=["wandb"])
  second = metrics.Run("b", root=tmp_path, writers=["wandb"])
  jax.jit(lambda: (first.log(0, x=1.0), second.log(0, x=2.0)))()
  first.close()
  second.close()
  for run, value in ((first, 1.0), (second, 2.0)):
    records = _wandb_records(run.writers[0].run)
    assert _wandb_values(records) == {("x", 0): value}


def test_wandb_refuses_the_names_of_its_own_columns_when_traced(
    wandb_offline, tmp_path):
  run = metrics.Run("own-columns", root=tmp_path, writers=["wandb"])
  with pytest.raises(ValueError, match="the W&B writer refuses the metric "
                     "name '_step': W&B fills the history column '_step'"):
    jax.jit(lambda x: run.log(0, _step=x))(1.0)
  with pytest.raises(ValueError, match=r"the W&B writer keys an array"):
    jax.jit(lambda x: run.log(0, w=jnp.stack([x, x]), **{"w/1": x}))(1.0)
  jax.jit(lambda x: run.log(0, step_count=x))(1.0)
  run.close()
  assert _wandb_values(_wandb_records(run.writers[0].run)) == {
      ("step_count", 0): 1.0}


# --- CLU ------------------------------------------------------------------------

class CluLikeWriter:
  """CLU's ``clu.metric_writers.MetricWriter`` interface, every method of
  it (CLU itself needs TensorFlow to import), keeping what it is given."""

  def __init__(self):
    self.scalars, self.calls = [], {"flush": 0, "close": 0}

  def write_summaries(self, step, values, metadata=None):
    raise AssertionError("hostcall writes scalars only")

  def write_scalars(self, step, scalars):
    assert isinstance(step, int)
    self.scalars.append((step, dict(scalars)))

  def write_images(self, step, images):
    raise AssertionError("hostcall writes scalars only")

  def write_videos(self, step, videos):
    raise AssertionError("hostcall writes scalars only")

  def write_audios(self, step, audios, *, sample_rate):
    raise AssertionError("hostcall writes scalars only")

  def write_texts(self, step, texts):
    raise AssertionError("hostcall writes scalars only")

  def write_histograms(self, step, arrays, num_buckets=None):
    raise AssertionError("hostcall writes scalars only")

  def write_pointcloud(self, step, point_clouds, *, point_colors=None,
                       configs=None):
    raise AssertionError("hostcall writes scalars only")

  def write_hparams(self, hparams):
    raise AssertionError("hostcall writes scalars only")

  def flush(self):
    self.calls["flush"] += 1

  def close(self):
    self.calls["close"] += 1


def test_a_clu_metric_writer_gets_every_value_at_its_step(tmp_path):
  clu_writer = CluLikeWriter()
  run = metrics.Run("clu", root=tmp_path, writers=[clu_writer, "jsonl"])
  assert isinstance(run.writers[0], metrics.CluWriter)
  assert run.writers[0].writer is clu_writer
  expected = _log_everywhere(run)
  hostcall.barrier()
  assert clu_writer.calls == {"flush": 1, "close": 0}
  run.close()  # flushes (at least once more), then closes once
  assert clu_writer.calls["flush"] >= 2 and clu_writer.calls["close"] == 1
  got = {}
  for step, scalars in clu_writer.scalars:
    for key, value in scalars.items():
      assert (key, step) not in got
      got[(key, step)] = value
  assert got == expected
  # One write_scalars per step, with every member's values of that step.
  assert [s for s, _ in clu_writer.scalars] == list(range(STEPS + 6))


def test_clu_s_own_metric_writer_base_takes_the_test_writer(tmp_path):
  # CLU's package needs TensorFlow (and flax) to import
  # clu.metric_writers; its interface module needs only JAX, so it is read
  # from the installed package's file. Where CLU is installed, the writer
  # the tests above use is a real MetricWriter (every abstract method
  # defined), and one made from it logs through a run.
  import importlib.util
  found = importlib.util.find_spec("clu")
  if found is None:
    pytest.skip("CLU is not installed (pip install clu; not a test extra: "
                "it needs flax and TensorFlow)")
  path = pathlib.Path(found.origin).parent / "metric_writers" / "interface.py"
  spec = importlib.util.spec_from_file_location("clu_interface", path)
  interface = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(interface)
  Real = type("Real", (CluLikeWriter, interface.MetricWriter), {})
  clu_writer = Real()  # TypeError if an abstract method were missing
  run = metrics.Run("clu-abc", root=tmp_path, writers=[clu_writer])
  jax.jit(lambda: run.log(5, loss=0.5))()
  run.close()
  assert clu_writer.scalars == [(5, {"loss": 0.5})]


def test_clu_writer_refuses_what_is_not_a_metric_writer():
  with pytest.raises(TypeError, match="CluWriter takes an object with CLU's "
                     "MetricWriter interface .* got 3 of type int"):
    metrics.CluWriter(3)


# --- Run options -----------------------------------------------------------------

def test_run_options_are_checked(tmp_path):
  with pytest.raises(ValueError, match=r"Run\(processes=...\) is one of "
                     r"\['each', 'gather', 'zero'\] .*got 'all'"):
    metrics.Run("bad", root=tmp_path, processes="all")
  with pytest.raises(TypeError, match=r"Run\(params=...\) is a dict of "
                     r"hyper-parameters, e.g. params=\{'lr': 0.1\}; got "
                     r"\[0.1\] of type list"):
    metrics.Run("bad", root=tmp_path, params=[0.1])
  with pytest.raises(ValueError, match=r"the metric name\(s\) \['process'\] "
                     "are columns hostcall fills itself"):
    metrics.Run("bad", root=tmp_path).log(0, process=1)


def test_one_process_s_rows_have_no_process_column(tmp_path):
  run = metrics.Run("single", root=tmp_path, processes="gather")
  jax.jit(lambda: run.log(0, x=1.0))()
  run.close()  # a job of one process: the run is written as always
  assert metrics.read(tmp_path / "single").to_dict("records") == [
      {"step": 0, "x": 1.0}]


def test_read_merges_the_directories_of_several_processes(tmp_path):
  # As Run(processes="each") leaves a run of two processes (each row with
  # its process), and as an older run without the column.
  for process, rows in ((1, [(0, 5.0), (1, 6.0)]), (0, [(0, 1.0)])):
    part = tmp_path / "fit" / f"process_{process}"
    part.mkdir(parents=True)
    (part / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "process": process, "loss": v}) + "\n"
        for s, v in rows))
  (tmp_path / "fit" / "process_x").mkdir()  # not a process's directory
  frame = metrics.read(tmp_path / "fit")
  assert frame.to_dict("records") == [
      {"step": 0, "process": 0, "loss": 1.0},
      {"step": 0, "process": 1, "loss": 5.0},
      {"step": 1, "process": 1, "loss": 6.0}]
  pytest.importorskip("matplotlib")
  assert metrics.plot(tmp_path / "fit").read_bytes()[:4] == b"\x89PNG"
  with pytest.raises(ValueError, match=r"takes names among \['loss'\]"):
    metrics.plot(tmp_path / "fit", metrics=["nope"])  # process: no metric
  old = tmp_path / "old" / "process_3"
  old.mkdir(parents=True)
  (old / "metrics.csv").write_text("step,loss\n0,2.5\n")
  assert metrics.read(tmp_path / "old").to_dict("records") == [
      {"process": 3, "step": 0, "loss": 2.5}]


def test_blocks_sent_between_processes_keep_their_values():
  from hostcall._apps.metrics import processes
  block = metrics.Block(
      step=np.array([3, 3]), member=np.array([0, 1]),
      device=np.array([2048, 2049]), process=np.array([1, 1]),
      metrics={"a/b c": np.array([True, False]),
               "bf16": jnp.asarray([1.5, -2.0], jnp.bfloat16),
               "w": np.arange(6.0).reshape(2, 3)})
  back = processes.decode(processes.encode(block))
  assert back.records() == block.records()
  assert list(back.metrics) == ["a/b c", "bf16", "w"]


def test_process_0_writes_what_the_others_send_and_says_who_never_closed(
    tmp_path, monkeypatch, caplog):
  from hostcall._apps.metrics import processes, sink
  client = FakeCoordinationClient()
  monkeypatch.setattr(processes, "job",
                      lambda: processes.Job(0, 3, client))
  monkeypatch.setattr(processes.Gather, "WAIT_MS", 20)
  monkeypatch.setattr(sink.RunSink, "GATHER_TIMEOUT", 0.5)
  run = metrics.Run("gathered-here", root=tmp_path, processes="gather",
                    writers=["memory", "jsonl"])
  # Process 1 (its writer, as its own Run makes it) sends two blocks and
  # closes; process 2 never closes its run.
  prefix = f'hostcall/metrics/{json.dumps("gathered-here")}/0'
  sender = processes.ForwardWriter(client, f"{prefix}/1")
  for first in (0, 2):
    sender.write(metrics.Block(step=np.array([first, first + 1]),
                               process=np.array([1, 1]),
                               metrics={"x": np.array([10.0 + first,
                                                       11.0 + first])}))
  sender.close()
  jax.jit(lambda: run.log(0, x=1.0))()  # process 0's own row
  with caplog.at_level("WARNING", logger="hostcall"):
    run.close()
  assert "without the rows of process(es) [2]" in caplog.text
  rows = sorted(map(tuple, metrics.read(run.dir)[["process", "step", "x"]]
                    .itertuples(index=False)))
  assert rows == [(0, 0, 1.0), (1, 0, 10.0), (1, 1, 11.0), (1, 2, 12.0),
                  (1, 3, 13.0)]
  assert client.deleted == [f"{prefix}/1/{i}" for i in range(3)]
  # Every key taken is deleted; the name process 0 gave the job's run
  # stays.
  assert client.values == {f"{prefix}/name": b"gathered-here"}


def test_a_process_other_than_0_writes_sends_or_drops_as_asked(
    tmp_path, monkeypatch, mlflow_client):
  from hostcall._apps.metrics import processes
  client = FakeCoordinationClient()
  monkeypatch.setattr(processes, "job", lambda: processes.Job(1, 2, client))
  for name in ("roles", "roles-sent", "roles-dropped"):  # process 0's names
    client.key_value_set_bytes(
        f"hostcall/metrics/{json.dumps(name)}/0/name", name.encode())
  each = metrics.Run("roles", root=tmp_path, writers=["jsonl", "mlflow"],
                     params={"lr": 0.5})
  sent = metrics.Run("roles-sent", root=tmp_path, writers=["jsonl", "mlflow"],
                     processes="gather")
  dropped = metrics.Run("roles-dropped", root=tmp_path, processes="zero")
  assert each.dir == tmp_path / "roles" / "process_1"
  assert [type(w).__name__ for w in sent.writers] == ["ForwardWriter"]
  assert dropped.writers == []
  jax.jit(lambda: [r.log(4, x=2.0) for r in (each, sent, dropped)])()
  for run in (each, sent, dropped):
    run.close()
  # "each": its own files and its own MLflow run, named for its process.
  assert metrics.read(tmp_path / "roles").to_dict("records") == [
      {"process": 1, "step": 4, "x": 2.0}]
  mlflow_run = mlflow_client.get_run(each.writers[1].run_id)
  assert mlflow_run.info.run_name == "roles/process_1"
  assert mlflow_run.data.params == {"lr": "0.5"}
  assert [(m.step, m.value) for m in mlflow_client.get_metric_history(
      mlflow_run.info.run_id, "x/process_1")] == [(4, 2.0)]
  # "gather": nothing written here; the block, then the end, sent.
  assert not (tmp_path / "roles-sent").exists()
  prefix = f'hostcall/metrics/{json.dumps("roles-sent")}/0/1'
  assert sorted(k for k in client.values if k.startswith(prefix)) == [
      f"{prefix}/0", f"{prefix}/1"]
  assert processes.decode(client.values[f"{prefix}/0"]).records() == [
      {"step": 4, "process": 1, "x": 2.0}]
  assert client.values[f"{prefix}/1"] == b"end"
  # "zero": dropped.
  assert not (tmp_path / "roles-dropped").exists()


# --- Every value of a step, names the tools refuse (issue 40) ---------------------

def test_mlflow_keeps_every_value_logged_at_one_step(mlflow_client,
                                                     tmp_path):
  run = metrics.Run("again", root=tmp_path, writers=["mlflow", "memory"])
  ev = jax.jit(lambda x: run.log(2, val=x))
  for x in (1.0, 2.0, 3.0):
    ev(x)
  run.close()
  history = mlflow_client.get_metric_history(run.writers[0].run_id, "val")
  assert sorted((m.step, m.value) for m in history) == [
      (2, 1.0), (2, 2.0), (2, 3.0)]


def test_a_clu_writer_gets_every_value_logged_at_one_step(tmp_path):
  clu = CluLikeWriter()
  run = metrics.Run("again-clu", root=tmp_path, writers=[clu])
  ev = jax.jit(lambda x: run.log(2, val=x))
  for x in (1.0, 2.0, 3.0):
    ev(x)
  run.close()
  assert [(s, v) for s, values in clu.scalars for v in values.values()] == [
      (2, 1.0), (2, 2.0), (2, 3.0)]


@pytest.mark.parametrize("writer", ["mlflow", "clu"])
def test_an_array_beside_a_metric_named_as_its_element_is_refused(
    writer, request, tmp_path):
  if writer == "mlflow":
    request.getfixturevalue("mlflow_client")
  spec = "mlflow" if writer == "mlflow" else CluLikeWriter()
  run = metrics.Run("collide", root=tmp_path, writers=[spec, "memory"])
  with pytest.raises(ValueError, match=r"the array 'w' \(shape \(2,\)\) and "
                     r"the metric 'w/0' would both be 'w/0'"):
    jax.jit(lambda x: run.log(0, w=jnp.stack([x, x]), **{"w/0": x}))(1.0)
  run.log(0, w=jnp.ones(2), **{"w/2": 1.0})  # not an element: taken
  run.close()


@pytest.mark.parametrize("name", ["acc@1", "loss (train)", "a//b",
                                  "😀 loss", "x" * 300])
def test_a_metric_name_mlflow_refuses_is_refused_when_traced(
    name, mlflow_client, tmp_path):
  run = metrics.Run("names", root=tmp_path, writers=["mlflow", "jsonl"])
  with pytest.raises(ValueError) as caught:
    jax.jit(lambda x: run.log(0, **{name: x}))(1.0)
  assert f"the MLflow writer refuses the metric name {name!r}" in str(
      caught.value)
  assert "MLflow's names may only contain" in str(caught.value)
  jax.jit(lambda x: run.log(0, ok=x))(1.0)  # the others still reach MLflow
  run.close()
  assert [m.value for m in mlflow_client.get_metric_history(
      run.writers[0].run_id, "ok")] == [1.0]
  # Without MLflow the name is a column like any other.
  plain = metrics.Run("names-plain", root=tmp_path, writers=["jsonl"])
  jax.jit(lambda x: plain.log(0, **{name: x}))(2.0)
  plain.close()
  assert metrics.read(plain.dir)[name].tolist() == [2.0]


def test_params_mlflow_refuses_are_refused_when_the_run_is_made(
    mlflow_client, tmp_path):
  with pytest.raises(ValueError, match=r"the MLflow writer refuses the "
                     r"parameter 'bad key%': '%' is not among the characters "
                     r"MLflow takes.*Rename it \(e.g. 'bad key_'\)"):
    metrics.Run("params", root=tmp_path, writers=["mlflow"],
                params={"lr": 0.1, "bad key%": 1})
  with pytest.raises(ValueError, match="more than MLflow's 6000"):
    metrics.Run("params", root=tmp_path, writers=["mlflow"],
                params={"notes": "x" * 6001})
  run = metrics.Run("params", root=tmp_path, writers=["mlflow"],
                    params={"lr": 0.1, "bad key_": 1})
  run.close()
  assert mlflow_client.get_run(run.writers[0].run_id).data.params == {
      "lr": "0.1", "bad key_": "1"}
