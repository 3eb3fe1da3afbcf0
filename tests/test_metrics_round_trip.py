"""A run's config, nested keys and text values through every writer, read
back with each tool's own reader: the files (``config.json``,
``metrics.jsonl``, ``metrics.csv``), MLflow's client on a SQLite store,
W&B's offline file (``wandb leet inspect --json``), TensorBoard's event
files (the protobufs tensorboardX ships) and a CLU writer's calls; and
what the tools would lose refused when the call is traced: names
tensorboardX would merge, the name W&B drops, a store MLflow would retry
for 100 s (issue 54)."""

import csv
import json
import os
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import metrics
from tests.helpers import tensorboard_events, wandb_records

PARAMS = {"lr": 0.1, "opt": {"name": "adam", "betas": [0.9, 0.99]}}
CONFIG = {**PARAMS, "batch": 32}  # after run.config.update({"batch": 32})


class CluTexts:
  """A CLU ``MetricWriter`` (the part hostcall calls), keeping what it is
  given."""

  def __init__(self):
    self.scalars, self.texts, self.hparams = [], [], []

  def write_scalars(self, step, scalars):
    self.scalars.append((step, dict(scalars)))

  def write_texts(self, step, texts):
    self.texts.append((step, dict(texts)))

  def write_hparams(self, hparams):
    self.hparams.append(dict(hparams))

  def flush(self):
    pass

  def close(self):
    pass


@pytest.fixture
def trackers(tmp_path, monkeypatch):
  """MLflow on a SQLite store and W&B offline, their files in tmp_path;
  returns MLflow's client."""
  pytest.importorskip("mlflow")
  pytest.importorskip("wandb")
  pytest.importorskip("tensorboardX")
  from mlflow import MlflowClient
  uri = f"sqlite:///{tmp_path}/mlflow.db"
  monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
  monkeypatch.chdir(tmp_path)  # where MLflow would put artifacts
  for key, value in dict(WANDB_MODE="offline", WANDB_DIR=str(tmp_path),
                         WANDB_SILENT="true", WANDB_CONSOLE="off").items():
    monkeypatch.setenv(key, value)
  return MlflowClient(tracking_uri=uri)


def _hparams(logdir) -> dict:
  """The hparams of a TensorBoard run, as its HParams tab reads them (the
  first session start of the run)."""
  from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
  for event in tensorboard_events(logdir):
    for value in event.summary.value:
      if value.tag == "_hparams_/session_start_info":
        data = HParamsPluginData()
        data.ParseFromString(value.metadata.plugin_data.content)
        return {k: getattr(v, v.WhichOneof("kind")) for k, v in
                data.session_start_info.hparams.items()}
  return {}


def _tensorboard_values(logdir) -> dict:
  """{(tag, step): value} of a TensorBoard run's scalars and texts."""
  got = {}
  for event in tensorboard_events(logdir):
    for value in event.summary.value:
      if value.HasField("simple_value"):
        got[(value.tag, event.step)] = value.simple_value
      elif value.metadata.plugin_data.plugin_name == "text":
        got[(value.tag, event.step)] = value.tensor.string_val[0].decode()
  return got


def _wandb_config(records) -> dict:
  """A W&B run's config: its start's, then each update."""
  config = {}
  for record in records:
    if record["type"] == "run":
      config.update(record["run"]["config"]["update"])
    elif record["type"] == "config":
      config.update(record["config"]["update"])
  config.pop("_wandb", None)
  return config


def _wandb_history(records) -> dict:
  """{(key, step): value} of a W&B run's history."""
  return {(key, r["history"]["step"]["num"]): value for r in records
          if r["type"] == "history"
          for key, value in r["history"]["item"].items()
          if not key.startswith("_")}


# --- Config ------------------------------------------------------------------

def test_params_are_kept_beside_the_rows_and_read_back(tmp_path):
  run = metrics.Run("ctx", root=tmp_path, params={"lr": 0.1, "opt": "adam"})
  jax.jit(lambda: run.log(0, loss=1.0))()
  run.flush()
  assert json.loads((run.dir / "config.json").read_text()) == {
      "lr": 0.1, "opt": "adam"}
  # Updated after the run opened, as wandb.config is.
  run.config.update({"batch": 32})
  run.config["seed"] = 0
  run.config.warmup = np.int32(5)  # (as a Python int)
  run.config.setdefaults({"lr": 0.5, "epochs": 3})  # lr kept
  assert (run.config.lr, run.config["opt"], "batch" in run.config) == (
      0.1, "adam", True)
  assert run.config.as_dict() == {"lr": 0.1, "opt": "adam", "batch": 32,
                                  "seed": 0, "warmup": 5, "epochs": 3}
  with pytest.raises(ValueError, match=r"attempted to change the value of "
                     r"key 'lr' from 0.1 to 0.2; pass allow_val_change=True"):
    run.config.update({"lr": 0.2})
  run.config.update({"lr": 0.1})  # the same value: no change
  run.config.update({"opt": "sgd"}, allow_val_change=True)
  run.close()
  expected = {"lr": 0.1, "opt": "sgd", "batch": 32, "seed": 0, "warmup": 5,
              "epochs": 3}
  assert metrics.read_config(run.dir) == expected
  assert metrics.read_config(run.dir / "metrics.jsonl") == expected
  assert metrics.read_config(run.dir / "config.json") == expected
  assert sorted(p.name for p in run.dir.iterdir()) == [
      "config.json", "metrics.jsonl"]  # no file left half written
  # A run going on with the files (exists="append") goes on with the
  # config; a new run of the name has its own.
  again = metrics.Run("ctx", root=tmp_path, exists="append",
                      params={"epochs": 5})
  assert again.config.as_dict() == {**expected, "epochs": 5}
  again.close()
  assert metrics.read_config(again.dir) == {**expected, "epochs": 5}
  fresh = metrics.Run("ctx", root=tmp_path, writers=["csv"])
  fresh.close()
  assert fresh.dir != run.dir and metrics.read_config(fresh.dir) == {}


def test_config_values_are_json_values_or_refused(tmp_path):
  run = metrics.Run("values", root=tmp_path, writers=["csv"],
                    params={"shape": (2, 3), "w": jnp.arange(2.0),
                            "path": tmp_path / "x", "none": None})
  assert run.config.as_dict() == {"shape": [2, 3], "w": [0.0, 1.0],
                                  "path": str(tmp_path / "x"), "none": None}
  with pytest.raises(TypeError, match=r"config 'f': expected a number, a "
                     r"bool, text, None, or a list or dict \(str keys\) of "
                     r"them, got <built-in function len> of type "
                     r"builtin_function_or_method"):
    run.config.update({"f": len})
  with pytest.raises(TypeError, match=r"config 'opt': a dict's keys are "
                     r"text, got the key 1 of type int"):
    run.config.update({"opt": {1: 2}})
  with pytest.raises(TypeError, match="got a traced value"):
    jax.jit(lambda x: run.config.update({"x": x}))(1.0)
  run.close()
  assert metrics.read_config(run.dir) == run.config.as_dict()
  with pytest.raises(RuntimeError, match="is closed; its config can no "
                     "longer change"):
    run.config.update({"late": 1})


def test_config_round_trips_through_every_writer(trackers, tmp_path):
  clu = CluTexts()
  run = metrics.Run("cfg", root=tmp_path, params=PARAMS, writers=[
      "jsonl", "csv", "tensorboard", "mlflow", "wandb", "memory", clu])
  jax.jit(lambda: run.log(0, loss=1.0))()
  run.config.update({"batch": 32})  # after the run opened
  run.close()
  flat = {"lr": 0.1, "opt.name": "adam", "opt.betas": [0.9, 0.99],
          "batch": 32}
  assert metrics.read_config(run.dir) == CONFIG
  mlflow, wandb = run.writers[3], run.writers[4]
  assert trackers.get_run(mlflow.run_id).data.params == {
      "lr": "0.1", "opt.name": "adam", "opt.betas": "[0.9, 0.99]",
      "batch": "32"}
  assert _wandb_config(wandb_records(wandb.run.settings.sync_file)) == CONFIG
  assert _hparams(run.dir / "tensorboard") == {
      "lr": 0.1, "opt.name": "adam", "opt.betas": "[0.9, 0.99]",
      "batch": 32.0}
  assert clu.hparams == [{k: v for k, v in flat.items() if k != "batch"},
                         flat]
  assert run.writers[5].config == CONFIG


def test_a_change_a_writer_cannot_keep_is_refused_before_anything_changes(
    trackers, tmp_path):
  run = metrics.Run("refused", root=tmp_path, params={"lr": 0.1},
                    writers=["jsonl", "mlflow", "wandb"])
  with pytest.raises(ValueError, match=r"the MLflow writer refuses to change "
                     r"the parameter 'lr' from '0.1' to '0.2': an MLflow run "
                     r"keeps a parameter's first value"):
    run.config.update({"lr": 0.2}, allow_val_change=True)
  with pytest.raises(ValueError, match=r"the W&B writer refuses the config "
                     r"key '--lr': W&B strips a key's leading and trailing "
                     r"'-'.* e.g. 'lr'"):
    run.config.update({"--lr": 0.2})
  with pytest.raises(ValueError, match=r"the MLflow writer refuses the "
                     r"parameter 'a@b'"):
    run.config["a@b"] = 1
  run.flush()
  assert run.config.as_dict() == {"lr": 0.1}
  assert metrics.read_config(run.dir) == {"lr": 0.1}
  run.close()
  assert trackers.get_run(run.writers[1].run_id).data.params == {"lr": "0.1"}


# --- Nested dicts and text ------------------------------------------------------

def _log_nested_and_texts(run):
  """Logs nested dicts and texts inside jit (a scan, and vmap) and outside
  it; returns {(key, step): value} as the tracking tools key them."""
  def step(w, i):
    run.log({"train": {"loss": w, "acc": {"top1": 2 * w}}, "phase": "train"},
            step=i)
    return w * 0.5, None

  jax.jit(lambda: jax.lax.scan(step, 1.0, jnp.arange(3)))()
  run.log({"eval": {"loss": 0.5}, "phase": "eval"}, step=3)
  jax.jit(jax.vmap(lambda x: run.log(4, m={"x": x}, note="vmapped")))(
      jnp.array([1.0, 2.0]))
  expected = {}
  for i in range(3):
    expected.update({("train.loss", i): 0.5 ** i,
                     ("train.acc.top1", i): 2 * 0.5 ** i,
                     ("phase", i): "train"})
  expected.update({("eval.loss", 3): 0.5, ("phase", 3): "eval",
                   ("m.x/member_0", 4): 1.0, ("m.x/member_1", 4): 2.0,
                   ("note/member_0", 4): "vmapped",
                   ("note/member_1", 4): "vmapped"})
  return expected


def test_nested_keys_and_texts_round_trip_through_every_writer(trackers,
                                                                tmp_path):
  clu = CluTexts()
  run = metrics.Run("nested", root=tmp_path, writers=[
      "jsonl", "csv", "tensorboard", "mlflow", "wandb", "memory", clu])
  expected = _log_nested_and_texts(run)
  run.close()
  rows = [{"step": 0, "train.loss": 1.0, "train.acc.top1": 2.0,
           "phase": "train"},
          {"step": 1, "train.loss": 0.5, "train.acc.top1": 1.0,
           "phase": "train"},
          {"step": 2, "train.loss": 0.25, "train.acc.top1": 0.5,
           "phase": "train"},
          {"step": 3, "eval.loss": 0.5, "phase": "eval"},
          {"step": 4, "member": 0, "m.x": 1.0, "note": "vmapped"},
          {"step": 4, "member": 1, "m.x": 2.0, "note": "vmapped"}]
  lines = (run.dir / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line) for line in lines] == rows
  with open(run.dir / "metrics.csv", newline="") as f:
    table = [{k: v for k, v in row.items() if v != ""}
             for row in csv.DictReader(f)]
  assert table == [{k: str(v) for k, v in row.items()} for row in rows]
  assert run.records() == rows  # the memory writer's
  # MLflow: metrics at their steps, a text as a tag (its last value).
  mlflow = run.writers[3]
  data = trackers.get_run(mlflow.run_id).data
  numbers = {k: v for k, v in expected.items() if not isinstance(v, str)}
  assert {(key, m.step): m.value for key in data.metrics
          for m in trackers.get_metric_history(mlflow.run_id, key)} == numbers
  assert {k: v for k, v in data.tags.items()
          if not k.startswith("mlflow.")} == {
              "phase": "eval", "note/member_0": "vmapped",
              "note/member_1": "vmapped"}
  # W&B: every value, text included, under W&B's own nested names.
  records = wandb_records(run.writers[4].run.settings.sync_file)
  assert _wandb_history(records) == expected
  # TensorBoard: numbers as scalars, texts as text summaries.
  assert _tensorboard_values(run.dir / "tensorboard") == {
      (f"{k}/text_summary" if isinstance(v, str) else k, s): v
      for (k, s), v in expected.items()}
  # CLU: write_scalars and write_texts, a step each.
  assert [s for s, _ in clu.scalars] == [0, 1, 2, 3, 4]
  assert clu.texts == [(0, {"phase": "train"}), (1, {"phase": "train"}),
                       (2, {"phase": "train"}), (3, {"phase": "eval"}),
                       (4, {"note/member_0": "vmapped",
                            "note/member_1": "vmapped"})]


def test_a_call_of_text_alone_logs_a_row_a_step_in_every_loop(tmp_path):
  run = metrics.Run("alone", root=tmp_path, writers=["memory"])

  def body(c, i):
    run.log({"phase": "loop"})  # no step, no number: nothing computed
    return c, None

  jax.jit(lambda: hostcall.scan(body, 0, jnp.arange(3), every=2))()
  jax.jit(lambda: hostcall.progress.scan(body, 0, jnp.arange(2),
                                         disable=True))()
  jax.jit(lambda: jax.lax.scan(body, 0, jnp.arange(2)))()
  run.log({"phase": "eager"})
  run.close()
  assert run.records() == [{"step": i, "phase": "loop"} for i in range(7)
                           ] + [{"step": 7, "phase": "eager"}]


@pytest.mark.parametrize("writer", ["jsonl", "csv"])
def test_texts_keep_every_character_in_the_files(writer, tmp_path):
  # (the last two, of one length, are joined into one block: a column of
  # two texts)
  texts = ['say "hi"', "100%", "é ☃", "two\nlines", "", "a,b", "x y"]
  run = metrics.Run("chars", root=tmp_path, writers=[writer, "memory"])

  def step(c, i):
    for k, text in enumerate(texts):  # one call site a text, then joined
      run.log(i, text=text, k=k)
    return c, None

  jax.jit(lambda: hostcall.scan(step, 0, jnp.arange(2), every=2))()
  run.close()
  expected = [{"step": i, "text": t, "k": k} for i in range(2)
              for k, t in enumerate(texts)]
  assert sorted(run.records(), key=lambda r: (r["step"], r["k"])) == expected
  if writer == "jsonl":
    got = [json.loads(line) for line in
           (run.dir / "metrics.jsonl").read_text().splitlines()]
  else:
    with open(run.dir / "metrics.csv", newline="", encoding="utf-8") as f:
      got = [{"step": int(r["step"]), "text": r["text"], "k": int(r["k"])}
             for r in csv.DictReader(f)]
  assert sorted(got, key=lambda r: (r["step"], r["k"])) == expected


def test_nested_keys_that_meet_and_texts_a_writer_cannot_keep_are_refused(
    trackers, tmp_path):
  run = metrics.Run("meet", root=tmp_path, writers=["jsonl"])
  with pytest.raises(ValueError, match=r"Run.log got two metrics named "
                     r"'a.b': a nested dict's keys are joined by '.'"):
    run.log({"a.b": 1.0, "a": {"b": 2.0}}, step=0)
  with pytest.raises(TypeError, match=r"keyed by names \(str\), got the key "
                     r"1 of type int in 'a'"):
    run.log({"a": {1: 2.0}}, step=0)
  with pytest.raises(ValueError, match=r"the metric\(s\) \['a.b'\] twice"):
    run.log({"a": {"b": 1.0}}, step=0, **{"a.b": 2.0})
  run.log({"train": {"step": 7}}, step=0)  # not the step column
  run.close()
  assert run.records() == [{"step": 0, "train.step": 7}]
  # A CLU writer without write_texts, and texts MLflow cannot tag.
  class Scalars:
    def write_scalars(self, step, scalars):
      pass
  clu = metrics.Run("no-texts", root=tmp_path, writers=[Scalars()])
  with pytest.raises(ValueError, match=r"the CLU writer .* refuses the text "
                     r"value\(s\) \['phase'\]: it has no write_texts"):
    jax.jit(lambda: clu.log(0, phase="train"))()
  clu.close()
  tagged = metrics.Run("tags", root=tmp_path, writers=["mlflow"])
  with pytest.raises(ValueError, match=r"the MLflow writer refuses the text "
                     r"'mlflow.note': MLflow keeps its own tags"):
    tagged.log(0, **{"mlflow.note": "x"})
  with pytest.raises(ValueError, match=r"the MLflow writer refuses the text "
                     r"'long': it has 8001 characters, more than an MLflow "
                     r"tag's 8000"):
    jax.jit(lambda: tagged.log(0, long="x" * 8001))()
  tagged.close()


def test_wandb_gets_nested_dicts_as_its_own_log_would(trackers, tmp_path):
  run = metrics.Run("tree", root=tmp_path, writers=["wandb"])
  wandb_run = run.writers[0].run
  wandb_run.define_metric("train.loss", summary="max")  # a nested key's name
  jax.jit(lambda: [run.log({"train": {"loss": x}, "a.b": x}, step=i)
                   for i, x in enumerate([1.0, 3.0, 2.0])])()
  with pytest.raises(ValueError, match=r"the W&B writer refuses the metric "
                     r"'a.b': the run logs it both as a nested dict's key and "
                     r"as a flat name"):
    run.log({"a": {"b": 1.0}}, step=3)
  with pytest.raises(ValueError, match=r"refuses the metric 'train': W&B "
                     r"holds the values of a nested dict under the key "
                     r"'train', which the run also logs as a value"):
    run.log({"train": 1.0}, step=3)
  run.close()
  records = wandb_records(wandb_run.settings.sync_file)
  assert _wandb_history(records) == {
      (key, i): x for i, x in enumerate([1.0, 3.0, 2.0])
      for key in ("train.loss", "a.b")}
  summary = {}
  for record in records:
    if record["type"] == "summary":
      summary.update(record["summary"]["update"])
  # define_metric matched the nested key (the flat one it would not).
  assert (summary["train.loss"], summary["a.b"]) == ({"max": 3}, 2)


# --- Names the tools rewrite or drop ------------------------------------------

def test_tensorboard_refuses_names_it_would_write_as_one_tag(trackers,
                                                             tmp_path):
  run = metrics.Run("tags", root=tmp_path, writers=["tensorboard", "jsonl"])
  with pytest.raises(ValueError, match=r"the TensorBoard writer refuses the "
                     r"metric name 'a_b': tensorboardX writes it as the tag "
                     r"'a_b', which the metric name 'a b' already has"):
    jax.jit(lambda: run.log({"a b": 1., "a_b": 2., "a?b": 3.}, step=0))()
  jax.jit(lambda: run.log({"a b": 1.}, step=0))()  # alone: tag a_b
  with pytest.raises(ValueError, match=r"refuses the metric name 'a\?b': .*"
                     r"the tag 'a_b', which the metric name 'a b'"):
    jax.jit(lambda: run.log({"a?b": 3.}, step=1))()  # in another call too
  with pytest.raises(ValueError, match=r"refuses the metric name '/': its "
                     r"tag would be empty"):
    run.log({"/": 1.0}, step=1)
  with pytest.raises(ValueError, match=r"refuses the text 'x': .* the "
                     r"metric name 'x/text_summary' already has"):
    run.log(1, x="a", **{"x/text_summary": 1.0})
  run.close()
  assert _tensorboard_values(run.dir / "tensorboard") == {("a_b", 0): 1.0}
  assert [json.loads(line) for line in (
      run.dir / "metrics.jsonl").read_text().splitlines()] == [
          {"step": 0, "a b": 1.0}]


def test_wandb_refuses_the_empty_name_when_traced(trackers, tmp_path):
  run = metrics.Run("empty", root=tmp_path, writers=["wandb", "jsonl"])
  with pytest.raises(ValueError, match=r"the W&B writer refuses the metric "
                     r"name '': W&B keeps no metric without a name"):
    jax.jit(lambda x: run.log(0, **{"": x, "y": x}))(1.0)
  jax.jit(lambda x: run.log(0, y=x))(1.0)
  run.close()
  assert _wandb_history(wandb_records(run.writers[0].run.settings.sync_file)
                        ) == {("y", 0): 1.0}
  files = metrics.Run("empty-files", root=tmp_path, writers=["jsonl"])
  files.log(0, **{"": 2.0})  # a file writer takes any name
  files.close()
  assert json.loads((files.dir / "metrics.jsonl").read_text()) == {
      "step": 0, "": 2.0}


# --- A store MLflow cannot open -------------------------------------------------

def _unwritable_dir(tmp_path):
  """A directory no file can be made in, even by root (whom modes do not
  stop): immutable (chattr +i) where the file system lets us, else (not
  root) read-only by its mode; None where neither holds."""
  path = tmp_path / "read-only"
  path.mkdir()
  if os.geteuid() != 0:
    path.chmod(0o555)
    return path, lambda: path.chmod(0o755)
  done = subprocess.run(["chattr", "+i", str(path)], capture_output=True)
  if done.returncode != 0:
    return None, None
  return path, lambda: subprocess.run(["chattr", "-i", str(path)],
                                      check=True)


@pytest.mark.parametrize("where", ["a directory", "a read-only directory"])
def test_an_mlflow_store_that_cannot_open_is_reported_within_seconds(
    where, trackers, tmp_path, monkeypatch):
  # MLflow retries a store its engine cannot open for 100 s (0.1 s, 0.3 s,
  # ... 51.1 s) before it raises; the writer opens the SQLite file itself
  # first. A directory in place of the file: no user can open it.
  undo = None
  if where == "a directory":
    path = tmp_path / "store.db"
    path.mkdir()
  else:
    directory, undo = _unwritable_dir(tmp_path)
    if directory is None:
      pytest.skip("cannot make a directory read-only here (root, without "
                  "chattr +i)")
    path = directory / "store.db"
  uri = f"sqlite:///{path}"
  monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
  try:
    start = time.monotonic()
    run = metrics.Run("store", root=tmp_path, writers=["mlflow", "jsonl"],
                      params={"lr": 0.1})
    opened = time.monotonic() - start
    assert run.writers[0].run_id is None  # the store refused the run
    jax.jit(lambda: [run.log(i, x=i) for i in range(3)])()
    with pytest.raises(hostcall.CallbackException, match=(
        rf"MLflow tracking store '{uri}' could not start a run "
        r"\(OperationalError: unable to open database file\); 3 row\(s\)")):
      hostcall.barrier()
    run.close()
    took = time.monotonic() - start
  finally:
    if undo is not None:
      undo()
  assert opened < 5 and took < 10, (opened, took)
  assert [json.loads(line)["x"] for line in (
      run.dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
