"""hostcall.metrics as users of W&B and notebooks expect (issue 40): W&B's
``run.log(dict, step=)``, one row a step whoever logged it, a run that
never destroys an earlier run's rows, a run that fails to open changing
nothing and leaking no file, and bad arguments named."""

import gc
import json
import logging
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import metrics
from hostcall._apps.metrics import registry


def _lines(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def _open_fds():
  return len(os.listdir("/proc/self/fd"))


# --- 1. W&B's form: a dict as the first argument -----------------------------

def test_log_takes_a_dict_of_metrics_as_wandb_does(tmp_path):
  run = metrics.Run("dict", root=tmp_path, writers=["jsonl", "memory"])
  jax.jit(lambda l, a, i: run.log({"loss": l, "acc": a}, step=i))(
      0.5, 0.25, 3)
  run.log({"loss": 0.125, "acc": 1.0}, step=4)       # outside jit
  jax.jit(lambda l: run.log(5, {"loss": l}))(2.0)      # step, then the dict
  jax.jit(lambda l: run.log({"loss": l}, step=6, acc=l / 2))(4.0)
  hostcall.barrier()
  expected = [{"step": 3, "loss": 0.5, "acc": 0.25},
              {"step": 4, "loss": 0.125, "acc": 1.0},
              {"step": 5, "loss": 2.0},
              {"step": 6, "loss": 4.0, "acc": 2.0}]
  assert run.records() == expected
  run.close()
  assert _lines(tmp_path / "dict" / "metrics.jsonl") == expected


def test_log_takes_a_dict_without_a_step_numbering_the_calls(tmp_path):
  run = metrics.Run("dict-nostep", root=tmp_path, writers=["memory"])
  f = jax.jit(lambda x: run.log({"loss": x}))
  f(1.0)
  f(2.0)
  assert run.records() == [{"step": 0, "loss": 1.0}, {"step": 1, "loss": 2.0}]
  run.close()


def test_a_metric_given_in_the_dict_and_as_a_keyword_is_refused_by_name(
    tmp_path):
  run = metrics.Run("dict-bad", root=tmp_path, writers=["memory"])
  with pytest.raises(ValueError, match=r"the metric\(s\) \['loss'\] twice"):
    jax.jit(lambda x: run.log({"loss": x, "acc": x}, step=0, loss=x))(1.0)
  with pytest.raises(TypeError, match="got the step twice"):
    run.log(1, step=2, loss=1.0)
  with pytest.raises(ValueError, match="has the key 'step'"):
    run.log({"step": 1, "loss": 1.0})
  with pytest.raises(TypeError, match=r"keyed by names \(str\), got the key 3"):
    run.log({3: 1.0}, step=0)
  with pytest.raises(TypeError, match="2 positional arguments"):
    run.log({"a": 1.0}, {"b": 2.0})
  assert run.records() == []
  run.close()


# --- 2. One row a step, whoever logged it --------------------------------------

@pytest.mark.parametrize("writer", ["memory", "jsonl", "csv"])
def test_log_and_log_grad_at_one_step_are_one_row(writer, tmp_path):
  run = metrics.Run("grad-row", root=tmp_path, writers=[writer])

  def loss(w, i):
    w = run.log_grad(i, w=w)
    value = jnp.sum(w ** 2)
    run.log(i, loss=value)
    return value

  step = jax.jit(jax.grad(loss))
  w = jnp.array([3.0, 4.0])
  for i in range(3):
    w = w - 0.25 * step(w, i)
  rows = run.records()
  assert [r["step"] for r in rows] == [0, 1, 2]
  assert [r["loss"] for r in rows] == [25.0, 6.25, 1.5625]
  assert [r["grad_norm/w"] for r in rows] == [10.0, 5.0, 2.5]
  frame = run.dataframe()
  assert not frame.isna().any().any()  # NaN now only means a NaN norm
  run.close()
  if writer != "memory":
    assert metrics.read(run.dir).to_dict("records") == rows


def test_a_scans_log_and_its_backward_log_grad_are_one_row_a_step(tmp_path):
  run = metrics.Run("scan-grad", root=tmp_path, writers=["jsonl"])

  def loss(w):
    def body(c, i):
      c = run.log_grad(i, c=c)
      run.log(i, c=c)
      return c * 2.0, None
    return jax.lax.scan(body, w, jnp.arange(4))[0]

  jax.jit(jax.grad(loss))(1.0)  # forward rows 0..3, then grads 3..0
  rows = run.records()
  assert rows == [{"step": i, "c": 2.0 ** i, "grad_norm/c": 2.0 ** (4 - i)}
                  for i in range(4)]
  run.close()
  # The file keeps the rows as logged, one a call.
  assert len(_lines(run.dir / "metrics.jsonl")) == 8


def test_a_metric_logged_twice_at_one_step_keeps_both_values(tmp_path):
  run = metrics.Run("twice", root=tmp_path, writers=["jsonl", "memory"])
  ev = jax.jit(lambda x: run.log(2, val=x))
  for x in (1.0, 2.0, 3.0):
    ev(x)
  jax.jit(lambda x: run.log(2, other=x))(4.0)
  rows = run.records()
  assert rows == [{"step": 2, "val": 1.0}, {"step": 2, "val": 2.0},
                  {"step": 2, "val": 3.0, "other": 4.0}]
  run.close()
  from hostcall._apps.metrics.reading import read_records
  assert read_records(run.dir) == rows


def test_vmap_members_of_one_step_stay_rows_of_their_own(tmp_path):
  run = metrics.Run("members", root=tmp_path, writers=["memory"])
  jax.jit(jax.vmap(lambda x: run.log(0, a=x)))(jnp.arange(2.0))
  jax.jit(jax.vmap(lambda x: run.log(0, b=x)))(jnp.arange(2.0) + 5)
  assert run.records() == [{"step": 0, "member": 0, "a": 0.0, "b": 5.0},
                           {"step": 0, "member": 1, "a": 1.0, "b": 6.0}]
  run.close()


# --- 3. A run never destroys an earlier run's rows ------------------------------

def test_a_second_run_of_a_name_gets_its_own_directory(tmp_path, caplog):
  first = metrics.Run("fit", root=tmp_path)
  f = jax.jit(lambda x: first.log(0, loss=x))
  f(1.0)
  first.close()
  with caplog.at_level(logging.WARNING, logger="hostcall"):
    second = metrics.Run("fit", root=tmp_path)
  assert second.dir == tmp_path / "fit-2"
  assert "fit-2" in repr(second) and "fit-2" in caplog.text
  assert "exists='append'" in caplog.text
  jax.jit(lambda x: second.log(0, loss=x))(2.0)
  third = metrics.Run("fit", root=tmp_path)  # fit-2 is open: fit-3
  assert third.dir == tmp_path / "fit-3"
  second.close()
  third.close()
  assert _lines(tmp_path / "fit" / "metrics.jsonl") == [
      {"step": 0, "loss": 1.0}]
  assert _lines(tmp_path / "fit-2" / "metrics.jsonl") == [
      {"step": 0, "loss": 2.0}]


def test_a_run_still_open_keeps_its_rows_and_its_functions(tmp_path):
  first = metrics.Run("cell", root=tmp_path, writers=["jsonl", "memory"])
  f = jax.jit(lambda x: first.log(loss=x))
  f(1.0)
  second = metrics.Run("cell", root=tmp_path, writers=["jsonl", "memory"])
  f(2.0)  # compiled for the first run: still its rows
  jax.jit(lambda x: second.log(loss=x))(3.0)
  assert first.records() == [{"step": 0, "loss": 1.0},
                             {"step": 1, "loss": 2.0}]
  assert second.records() == [{"step": 0, "loss": 3.0}]
  first.close()
  second.close()
  assert len(_lines(tmp_path / "cell" / "metrics.jsonl")) == 2


@pytest.mark.parametrize("writer", ["jsonl", "csv"])
def test_exists_append_goes_on_after_the_earlier_rows(writer, tmp_path):
  first = metrics.Run("go-on", root=tmp_path, writers=[writer])
  jax.jit(lambda: first.log(0, loss=1.0))()
  first.close()
  again = metrics.Run("go-on", root=tmp_path, writers=[writer],
                      exists="append")
  assert again.dir == tmp_path / "go-on"
  jax.jit(lambda: again.log(1, loss=0.5, acc=0.75))()  # a new column
  again.close()
  rows = metrics.read(tmp_path / "go-on")
  assert rows["step"].tolist() == [0, 1]
  assert rows["loss"].tolist() == [1.0, 0.5]
  assert np.isnan(rows["acc"][0]) and rows["acc"][1] == 0.75


def test_exists_overwrite_replaces_the_open_run_and_starts_afresh(tmp_path):
  first = metrics.Run("redo", root=tmp_path, writers=["jsonl", "memory"])
  f = jax.jit(lambda x: first.log(loss=x))
  f(1.0)
  hostcall.barrier()
  again = metrics.Run("redo", root=tmp_path, writers=["jsonl", "memory"],
                      exists="overwrite")
  f(2.0)  # the old object's function logs to the run that replaced it
  again.close()
  assert _lines(tmp_path / "redo" / "metrics.jsonl") == [
      {"step": 0, "loss": 2.0}]
  assert first.writers[1].records() == [{"step": 0, "loss": 1.0}]


def test_exists_takes_only_its_choices(tmp_path):
  with pytest.raises(ValueError, match=r"Run\(exists=...\) is one of "
                     r"\['append', 'new', 'overwrite'\] .*got 'replace'"):
    metrics.Run("x", root=tmp_path, exists="replace")
  with pytest.raises(ValueError, match=r"got \['new'\]"):
    metrics.Run("x", root=tmp_path, exists=["new"])


# --- 4. A run that fails to open changes nothing ---------------------------------

@pytest.fixture
def broken_writer(monkeypatch):
  """A named writer (of files) that fails when made, after the jsonl
  writer before it is made; and one whose extra is missing."""
  module = types.ModuleType("broken_writer_for_tests")

  def for_run(run_dir):
    raise OSError(f"no space left for {run_dir}")

  def for_run_missing(run_dir):
    registry.import_extra("missing", "hostcall_no_such_package")

  module.for_run, module.for_run_missing = for_run, for_run_missing
  monkeypatch.setitem(sys.modules, module.__name__, module)
  monkeypatch.setattr(registry, "WRITERS", registry.WRITERS + (
      registry.WriterEntry("broken", f"{module.__name__}:for_run",
                           files=True),
      registry.WriterEntry("missing", f"{module.__name__}:for_run_missing",
                           extra="missing", requires=("nothing",))))


@pytest.mark.parametrize("failing", [
    dict(writers=["jsonl", "missing"]),
    dict(writers=["jsonl", "mlflow"], params={"lr": 0.1, "bad key%": 1}),
    dict(writers=["jsonl", "broken"], exists="overwrite"),
    dict(writers=["jsonl", "missing"], exists="overwrite"),
    dict(writers=["jsonl", "mlflow"], exists="overwrite",
         params={"lr": 0.1, "bad key%": 1}),
])
def test_a_run_that_fails_to_open_changes_nothing(failing, broken_writer,
                                                   tmp_path, monkeypatch):
  if "mlflow" in failing["writers"]:
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path}/mlruns")
  run = metrics.Run("open", root=tmp_path)
  f = jax.jit(lambda x: run.log(loss=x))
  f(1.0)
  hostcall.barrier()
  with pytest.raises((OSError, ImportError, ValueError)):
    metrics.Run("open", root=tmp_path, **failing)
  f(2.0)
  run.log(loss=3.0)
  assert [r["loss"] for r in run.records()] == [1.0, 2.0, 3.0]
  run.close()
  assert [r["loss"] for r in _lines(tmp_path / "open" / "metrics.jsonl")] \
      == [1.0, 2.0, 3.0]


def test_a_run_that_fails_to_open_leaks_no_file(broken_writer, tmp_path):
  metrics.Run("warm", root=tmp_path).close()
  gc.collect()
  before = _open_fds()
  for _ in range(3):
    with pytest.raises(OSError, match="no space left"):
      metrics.Run("leak", root=tmp_path, writers=["jsonl", "broken"])
  assert _open_fds() == before
  assert not (tmp_path / "leak").exists()  # nor a directory left behind


def test_a_file_where_the_directory_should_be_changes_nothing(tmp_path):
  run = metrics.Run("mem", root=tmp_path, writers=["memory"])
  f = jax.jit(lambda x: run.log(loss=x))
  f(1.0)
  (tmp_path / "mem").write_text("not a directory")
  before = _open_fds()
  with pytest.raises(OSError):
    metrics.Run("mem", root=tmp_path, writers=["memory", "jsonl"],
                exists="overwrite")
  assert _open_fds() == before
  f(2.0)
  assert [r["loss"] for r in run.records()] == [1.0, 2.0]
  run.close()


def test_a_jsonl_writer_dropped_without_close_closes_its_file(tmp_path):
  gc.collect()
  before = _open_fds()
  writers = [metrics.JsonlWriter(tmp_path / f"{k}.jsonl") for k in range(3)]
  writers.append(metrics.CsvWriter(tmp_path / "t.csv"))
  writers[-1].write(metrics.Block(step=np.array([0]),
                                  metrics={"x": np.array([1.0])}))
  assert _open_fds() == before + 4
  del writers
  gc.collect()
  assert _open_fds() == before


# --- 8. Bad arguments named --------------------------------------------------------

def test_processes_given_as_a_list_is_refused_by_name(tmp_path):
  with pytest.raises(ValueError, match=r"Run\(processes=...\) is one of "
                     r"\['each', 'gather', 'zero'\] .*got \['each'\]"):
    metrics.Run("bad", root=tmp_path, processes=["each"])


def test_log_grad_refuses_a_step_too_large_as_log_does(tmp_path):
  if jax.config.jax_enable_x64:
    pytest.skip("64-bit integers take 2**40")
  run = metrics.Run("big-step", root=tmp_path, writers=["memory"])
  for call in (lambda: run.log(2 ** 40, loss=1.0),
               lambda: run.log_grad(2 ** 40, w=1.0)):
    with pytest.raises(ValueError, match=r"step 1099511627776 does not fit "
                       r"JAX's default integer \(int32\).*jax_enable_x64"):
      call()
  run.close()


def test_log_grad_of_an_empty_value_gives_nan_extremes(tmp_path):
  run = metrics.Run("empty", root=tmp_path, writers=["memory"])

  def loss(w, v):
    w, v = run.log_grad(0, stats=("norm", "min", "max", "nans"), w=w, v=v)
    return jnp.sum(w) + jnp.sum(v)

  jax.jit(jax.grad(loss))(jnp.zeros(0), jnp.ones(2))
  (row,) = run.records()
  assert row["grad_norm/w"] == 0.0 and row["grad_nans/w"] == 0
  assert np.isnan(row["grad_min/w"]) and np.isnan(row["grad_max/w"])
  assert row["grad_min/v"] == row["grad_max/v"] == 1.0
  run.close()
