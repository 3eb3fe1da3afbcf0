"""Two processes on 127.0.0.1 with jax.distributed, 2 CPU devices each: every
process's host functions receive exactly its local devices' data."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from hostcall import metrics
from tests.helpers import free_port, run_python_processes

WORKER = pathlib.Path(__file__).parent / "multiprocess" / "worker.py"


def _run_processes(tmp_path, n=2, timeout=240):
  port = free_port()
  outputs = run_python_processes(
      WORKER.read_text(), [[port, n, i, tmp_path] for i in range(n)],
      timeout=timeout)
  for i, out in enumerate(outputs):
    assert f"process {i} done" in out
  return [[json.loads(line) for line in
           (tmp_path / f"taps-{i}.jsonl").read_text().splitlines()]
          for i in range(n)]


def test_each_process_receives_its_local_devices_data(tmp_path):
  records = _run_processes(tmp_path)
  for process, lines in enumerate(records):
    local = {2 * process, 2 * process + 1}
    assert all(r["process"] == process == r["device_process"] for r in lines)
    for kind in ("tap", "async", "call"):
      mine = sorted((r["device"], r["value"]) for r in lines
                    if r["kind"] == kind)
      assert mine == [(d, [2.0 * d, 2.0 * d + 1]) for d in sorted(local)], (
          kind, mine)
  # The global view gathers to one call, made by the first device, which
  # belongs to process 0.
  global_calls = [r for lines in records for r in lines
                  if r["kind"] == "global"]
  assert global_calls == [{"kind": "global", "process": 0, "device": 0,
                           "device_process": 0,
                           "value": [float(i) for i in range(8)]}]
  # One progress bar, drawn by process 0 for its two devices; none in 1.
  with open(tmp_path / "bar-0.txt", newline="") as f:  # keep the \r
    bar = f.read()
  assert bar.count("\n") == 1 and "| 12/12 [" in bar.split("\r")[-1]
  assert (tmp_path / "bar-1.txt").read_text() == ""
  # Each process's run holds its own devices' rows, each with its device,
  # in its own directory; read() merges them with their process.
  everyone = sorted((p, d, i, 2.0 * d + i) for p in range(2)
                    for d in (2 * p, 2 * p + 1) for i in range(12))
  for process in range(2):
    rows = [json.loads(line) for line in
            (tmp_path / "run" / f"process_{process}" / "metrics.jsonl")
            .read_text().splitlines()]
    assert _rows(rows) == [r for r in everyone if r[0] == process]
  assert _rows(metrics.read(tmp_path / "run")) == everyone
  # processes="gather": process 0 alone wrote every process's rows, through
  # each of its writers; process 1 sent its rows to it.
  assert json.loads((tmp_path / "writers-1.json").read_text()) == [
      "ForwardWriter"]
  assert not list((tmp_path / "gathered").glob("process_*"))
  for name in ("metrics.jsonl", "metrics.csv"):
    assert _rows(metrics.read(tmp_path / "gathered" / name)) == everyone
  with_mlflow = importlib.util.find_spec("mlflow") is not None
  assert json.loads((tmp_path / "writers-0.json").read_text()) == [
      "JsonlWriter", "CsvWriter"] + ["MlflowWriter"] * with_mlflow
  if with_mlflow:
    from mlflow import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (only,) = client.search_runs(["0"])  # one MLflow run, process 0's
    assert only.info.run_name == "gathered"
    assert only.data.params == {"devices": "4"}
    logged = []
    for key in only.data.metrics:  # value/process_<p>/device_<id>
      _, process, device = key.split("/")
      logged += [{"process": int(process.split("_")[1]),
                  "device": int(device.split("_")[1]), "step": m.step,
                  "value": m.value}
                 for m in client.get_metric_history(only.info.run_id, key)]
    assert _rows(logged) == everyone
  # processes="zero": process 0's rows alone.
  assert _rows(metrics.read(tmp_path / "zero")) == [
      r for r in everyone if r[0] == 0]


def _rows(rows):
  """(process, device index, step, value) of each row (records or a
  DataFrame). Process p's two devices have indices 2p and 2p + 1 in
  jax.devices(), but other ids (process 1's CPU devices are 2048, 2049)."""
  if hasattr(rows, "to_dict"):
    rows = rows.to_dict("records")
  ids = {}
  for r in rows:
    ids.setdefault(r["process"], set()).add(r["device"])
  return sorted((r["process"], 2 * r["process"] + sorted(
      ids[r["process"]]).index(r["device"]), r["step"], r["value"])
      for r in rows)


def test_steered_loops_stop_in_every_process_after_the_same_check(tmp_path):
  _run_processes(tmp_path)
  steer = [json.loads((tmp_path / f"steer-{i}.json").read_text())
           for i in range(2)]
  # shard_map: process 1's host asked; process 0's devices stopped with
  # its devices, at the same step (else the psum in the body would hang).
  steps = {s for p in steer for s in p["shard_map"]["steps"]}
  assert len(steps) == 1 and 300 <= steps.pop() < 100_000
  # Each of the 4 devices holds 2 of x's 8 values; psum adds the blocks.
  n = steer[0]["shard_map"]["steps"][0]
  assert [c for p in steer for c in p["shard_map"]["carry"]] == \
      [[12.0 * n, 16.0 * n]] * 4
  # Global view: process 0's host decides for every process.
  steps = {s for p in steer for s in p["global"]["steps"]}
  assert len(steps) == 1 and 300 <= (n := steps.pop()) < 100_000
  assert sorted(c for p in steer for c in p["global"]["carry"]) == \
      [[2.0 * d * n, (2.0 * d + 1) * n] for d in range(4)]


def test_a_failing_peer_is_reported_and_nothing_hangs(tmp_path):
  port = free_port()
  # Only one of two processes starts: the other never joins.
  proc = subprocess.Popen(
      [sys.executable, str(WORKER), str(port), "2", "0", str(tmp_path), "5"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    proc.communicate(timeout=120)
    assert proc.returncode != 0
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    pytest.fail("a process waiting for a missing peer did not give up")


STEERING_FAULTS = pathlib.Path(__file__).parent / "multiprocess" / (
    "steering_faults.py")


def _launch_pair(script, args, envs=({}, {})):
  """Two processes of ``script`` (``PORT 2 PROCESS_ID *args``), each with
  its ``envs`` entry added; ``(procs, [(stdout, stderr)])`` once both
  ended. A process still running after two minutes (waiting for a failed
  peer) fails the test, and no process outlives it."""
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, str(script), str(port), "2", str(i), *args],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env={**os.environ, **env}) for i, env in enumerate(envs)]
  try:
    outputs = [p.communicate(timeout=120) for p in procs]
  except subprocess.TimeoutExpired:
    pytest.fail("a process waited for its failed peer")
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  return procs, outputs


@pytest.mark.parametrize("fault,loop", [("raise", "scan"), ("raise", "while"),
                                        ("kill", "scan")])
def test_a_steered_loop_fails_on_every_process_never_hangs(fault, loop):
  # Only process 1's host function fails (or process 1 is killed) in a
  # steered loop whose body communicates across the processes.
  procs, outputs = _launch_pair(STEERING_FAULTS, [fault, loop])
  (out0, err0), (out1, err1) = outputs
  if fault == "raise":
    # Process 1 fails with its host function's error; process 0, which
    # stopped at the same check, with a pointer to it.
    assert "outcome 1 boom" in out1, err1[-3000:]
    assert "outcome 0 peer-failed" in out0, err0[-3000:]
    assert procs[0].returncode == procs[1].returncode == 0
  else:
    assert procs[1].returncode == -9
    # JAX's distributed service ends the survivor once the peer misses its
    # heartbeats, saying so (hostcall adds no wait of its own).
    assert procs[0].returncode != 0 and "outcome 0" not in out0
    assert "another task died" in err0, err0[-3000:]


ASYNC_FAULTS = pathlib.Path(__file__).parent / "multiprocess" / (
    "async_faults.py")


def _launch_async_faults(tmp_path, mode, queue0="ffi"):
  """Both processes of async_faults.py, process 0 queueing by ``queue0``'s
  route (``ffi``: the FFI handler; else JAX's callbacks), process 1 by
  the other."""
  native = ["1", "0"] if queue0 == "ffi" else ["0", "1"]
  return _launch_pair(ASYNC_FAULTS, [mode, str(tmp_path)],
                      [{"HOSTCALL_NATIVE": n} for n in native])


def test_an_asynchronous_tap_raising_in_one_process_is_reported_there(
    tmp_path):
  # Process 0 queues through the FFI handler, process 1 through JAX's
  # callbacks; each process fails in one run and watches its peer fail in
  # the other, so each route plays each part.
  procs, outputs = _launch_async_faults(tmp_path, "raise")
  for i, (p, (out, err)) in enumerate(zip(procs, outputs)):
    assert p.returncode == 0, f"process {i}:\n{err[-4000:]}"
    assert f"process {i} done" in out
  for process in range(2):
    runs = [json.loads(line) for line in
            (tmp_path / f"faults-{process}.jsonl").read_text().splitlines()]
    assert [r["failing_process"] for r in runs] == [1, 0]
    for run in runs:
      assert run["native"] is (process == 0)
      # Every tap of each local device arrived, in order, the failing
      # device's later ones too; the loop's psum ran every step.
      local = [2 * process, 2 * process + 1]
      assert run["seen"] == {str(d): list(range(12)) for d in local}
      # c' = mean(c) + v, from 0, 12 steps: 11 * 1.5 + v.
      assert run["carry"] == [16.5 + 2 * process]
      if run["failing_process"] == process:
        # Its own barrier raises the failure, once.
        assert (f"ValueError: boom on device {2 * process} in process "
                f"{process}") in run["barrier"], run["barrier"]
        assert "1 tap function call(s) raised" in run["barrier"][-1]
      else:
        assert run["barrier"] == "nothing"  # the peer's failure is not its


@pytest.mark.parametrize("survivor_queue", ["ffi", "jax_callbacks"])
def test_a_process_killed_mid_loop_ends_its_tapping_peer(tmp_path,
                                                         survivor_queue):
  procs, outputs = _launch_async_faults(tmp_path, "kill", survivor_queue)
  (out0, err0), _ = outputs
  assert procs[1].returncode == -9
  # JAX's distributed service ends the survivor once the peer misses its
  # heartbeats, saying so; it does not hang in the loop's psum.
  assert procs[0].returncode != 0 and "outcome 0" not in out0
  assert "another task died" in err0, err0[-3000:]
  # What the survivor's tap functions received until then: each device's
  # taps in order, none twice, with the values the device sent.
  taps = {}
  for line in (tmp_path / "taps-0.txt").read_text().splitlines():
    device, step, value = line.split()
    taps.setdefault(int(device), []).append((int(step), float(value)))
  assert set(taps) == {0, 1}
  for device, received in taps.items():
    assert received == [(s, device + s) for s in range(len(received))]
  # The killed peer reached its failing step: the survivor tapped past it.
  assert max(len(received) for received in taps.values()) > 300
