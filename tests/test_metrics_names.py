"""A run's name, decided once, and runs made again (issue 52): runs made at
once in threads, in processes started together and in the processes of one
jax.distributed job each get one directory (the job's processes the same
one); a run made again and again (a notebook cell run again) leaves one run
open, and whatever still logs to an earlier one keeps it open."""

import gc
import json
import os
import threading

import jax
import pytest

import hostcall
from hostcall import host_callback as hcb, metrics
from hostcall._apps.metrics import processes
from tests.helpers import (FakeCoordinationClient, free_port,
                           run_python_processes)


def _lines(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def _open_fds():
  return len(os.listdir("/proc/self/fd"))


def _settled_fds():
  """Open files once what earlier tests left is released (their programs
  collected, then a barrier: its call sites forgotten, their runs
  finished)."""
  gc.collect()
  hostcall.barrier()
  return _open_fds()


def _files_open_in(directory):
  """How many of this process's open files are in ``directory``."""
  inside = 0
  for fd in os.listdir("/proc/self/fd"):
    try:
      inside += os.readlink(f"/proc/self/fd/{fd}").startswith(
          f"{directory}{os.sep}")
    except OSError:  # closed meanwhile
      pass
  return inside


def _numbered(name, count):
  return [name] + [f"{name}-{n}" for n in range(2, count + 1)]


# --- 1. One directory a run, claimed at once --------------------------------

def test_runs_made_at_once_in_threads_get_a_directory_each(tmp_path):
  threads, each = 6, 4
  start = threading.Barrier(threads)
  made, failures = {}, []

  def make(t):
    try:
      start.wait()
      runs = [metrics.Run("same", root=tmp_path) for _ in range(each)]
      with jax.disable_jit():  # (rows written as logged: no compiling)
        for k, run in enumerate(runs):
          for step in range(3):
            run.log(step, who=10 * t + k)
      for run in runs:
        run.close()
      made.update({10 * t + k: run for k, run in enumerate(runs)})
    except BaseException as exc:  # noqa: BLE001 - reported below
      failures.append(exc)

  workers = [threading.Thread(target=make, args=(t,)) for t in range(threads)]
  for worker in workers:
    worker.start()
  for worker in workers:
    worker.join()
  assert not failures
  assert sorted(run.dir.name for run in made.values()) == sorted(
      _numbered("same", threads * each))
  for who, run in made.items():  # each directory holds its run's rows alone
    assert _lines(run.dir / "metrics.jsonl") == [
        {"step": step, "who": who} for step in range(3)]


_SWEEP = """
import json, sys
import jax
from hostcall import metrics
root, me = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()  # every process starts making its runs now
runs = [metrics.Run("sweep", root=root) for _ in range(10)]
with jax.disable_jit():
  for k, run in enumerate(runs):
    run.log(0, who=100 * me + k)
for run in runs:
  run.close()
print(json.dumps({run.dir.name: 100 * me + k for k, run in enumerate(runs)}))
"""


def test_processes_started_together_get_a_directory_each(tmp_path):
  outputs = run_python_processes(
      _SWEEP, [[tmp_path, me] for me in range(4)], at_once=True)
  made = {}
  for out in outputs:
    made.update(json.loads(out.splitlines()[-1]))
  assert sorted(made) == sorted(_numbered("sweep", 40))
  for name, who in made.items():
    assert _lines(tmp_path / name / "metrics.jsonl") == [
        {"step": 0, "who": who}]


_JOB = """
import json, os, sys
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
port, me, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                           num_processes=2, process_id=me,
                           initialization_timeout=120)
jax.devices()  # every process's backend up (process 1 waits below)
import hostcall
from hostcall import metrics
from hostcall._apps.metrics import processes
client = processes.job().client
runs = {}
for mode in ("gather", "zero", "each"):
  if me == 1:  # process 0's run of the name exists, its files written
    client.blocking_key_value_get(f"test/{mode}", 120_000)
  runs[mode] = metrics.Run("g", root=root, processes=mode)
  with jax.disable_jit():
    runs[mode].log(0, x=float(me))
  if me == 0:
    runs[mode].flush()
    client.key_value_set(f"test/{mode}", "made")
for run in runs.values():  # process 0's gathered run waits for process 1's
  run.close()
if me == 0:
  client.key_value_set("test/closed", "yes")
else:
  client.blocking_key_value_get("test/closed", 120_000)
print(json.dumps({mode: [os.path.relpath(run.dir, root), run.records()]
                  for mode, run in runs.items()}))
jax.distributed.shutdown()
"""


def test_the_processes_of_a_job_give_a_run_one_name(tmp_path):
  port = free_port()
  outputs = run_python_processes(_JOB, [[port, me, tmp_path]
                                        for me in range(2)])
  seen = [json.loads(out.splitlines()[-1]) for out in outputs]

  def rows(records):
    return [(r["process"], r["step"], r["x"]) for r in records]

  for me in range(2):
    # "gather": process 1 made its run once process 0's directory was
    # there, and still took its name: its records() reads process 0's
    # files, every process's rows.
    assert seen[me]["gather"][0] == "g"
    assert rows(seen[me]["gather"][1]) == [(0, 0, 0.0), (1, 0, 1.0)]
    assert seen[me]["zero"][0] == "g-2"
    assert rows(seen[me]["zero"][1]) == [(0, 0, 0.0)]
    # "each": a directory no earlier run has, the same in both.
    assert seen[me]["each"][0] == os.path.join("g-3", f"process_{me}")
    assert rows(seen[me]["each"][1]) == [(me, 0, float(me))]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["g", "g-2", "g-3"]


def test_a_process_takes_process_0_s_name_or_its_failure(tmp_path,
                                                         monkeypatch):
  client = FakeCoordinationClient()
  monkeypatch.setattr(processes, "NAME_WAIT_MS", 20)
  job = processes.Job(0, 2, client)
  assert processes.one_name(job, "p", lambda: "fit-7", "Run('fit')") == \
      "fit-7"
  assert processes.one_name(processes.Job(1, 2, client), "p", None,
                            "Run('fit')") == "fit-7"

  def fails():
    raise OSError("read-only file system")

  with pytest.raises(OSError, match="read-only"):
    processes.one_name(job, "q", fails, "Run('fit')")
  with pytest.raises(RuntimeError, match=r"Run\('fit'\) failed to open in "
                     r"process 0, which names it for the whole job"):
    processes.one_name(processes.Job(1, 2, client), "q", None, "Run('fit')")
  monkeypatch.setattr(processes, "NAME_TIMEOUT", 0.0)
  with pytest.raises(RuntimeError, match="process 1 could not learn the "
                     r"directory of Run\('late'\) from process 0"):
    processes.one_name(processes.Job(1, 2, client), "r", None, "Run('late')")


def test_a_process_s_own_part_an_earlier_job_left_is_refused(tmp_path,
                                                            monkeypatch):
  client = FakeCoordinationClient()
  monkeypatch.setattr(processes, "job", lambda: processes.Job(1, 2, client))
  for name in ("left", "clean"):  # process 0 found both free
    client.key_value_set_bytes(
        f"hostcall/metrics/{json.dumps(name)}/0/name", name.encode())
  stale = tmp_path / "left" / "process_1"  # this process's disk only
  stale.mkdir(parents=True)
  (stale / "metrics.jsonl").write_text('{"step": 0, "x": 9.0}\n')
  with pytest.raises(FileExistsError, match="do not share this file system"):
    metrics.Run("left", root=tmp_path)
  assert _lines(stale / "metrics.jsonl") == [{"step": 0, "x": 9.0}]
  run = metrics.Run("clean", root=tmp_path)
  assert run.dir == tmp_path / "clean" / "process_1"
  run.close()


def test_an_existing_directory_is_never_a_new_run_s(tmp_path):
  (tmp_path / "made").mkdir()  # empty: maybe a racing run's, just made
  (tmp_path / "made-2").write_text("a file")
  run = metrics.Run("made", root=tmp_path)
  memory = metrics.Run("made", root=tmp_path, writers=["memory"])
  assert run.dir == tmp_path / "made-3"
  assert memory.dir == tmp_path / "made-4"  # made-3 is an open run's
  run.close()
  memory.close()
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "made", "made-2", "made-3"]  # no directory for the memory run


# --- 2. A run made again finishes the one before ---------------------------

def test_a_run_made_again_and_again_keeps_one_open_and_every_row(tmp_path):
  cell = {}  # a notebook's globals, the cell run 100 times
  warm = metrics.Run("warm", root=tmp_path)
  warm.log(0, loss=0.0)
  warm.close()
  before = _settled_fds()
  counts = []
  for k in range(100):
    cell["run"] = metrics.Run("fit", root=tmp_path)
    if k % 10 == 0:  # rows delivered asynchronously, waited for
      cell["run"].log(0, loss=float(k))
      cell["run"].log(1, loss=k + 0.5)
      hostcall.barrier()
    else:
      with jax.disable_jit():  # (rows written as logged: no compiling)
        cell["run"].log(0, loss=float(k))
        cell["run"].log(1, loss=k + 0.5)
    counts.append(_files_open_in(tmp_path))
  # Each run made finished those nothing logs to any more: the one before
  # is open until the next run is made or a barrier (a notebook's end of a
  # cell) comes.
  assert counts == [1 if k % 10 == 0 else 2 for k in range(100)]
  hostcall.barrier()
  assert _files_open_in(tmp_path) == 1
  assert _open_fds() <= before + 1  # (they grew by 100)
  for k in range(100):
    name = "fit" if k == 0 else f"fit-{k + 1}"
    assert _lines(tmp_path / name / "metrics.jsonl") == [
        {"step": 0, "loss": float(k)}, {"step": 1, "loss": k + 0.5}]
  cell["run"].close()
  assert _open_fds() == before


def test_a_run_a_compiled_program_logs_to_stays_open_until_it_is_gone(
    tmp_path):
  cell = {"run": metrics.Run("kept", root=tmp_path)}
  f = jax.jit(lambda x: cell["run"].log(loss=x))  # the global, as traced
  f(1.0)
  first = cell["run"].dir
  before = _settled_fds()
  for _ in range(3):  # the first Run object is gone; f is not
    cell["run"] = metrics.Run("kept", root=tmp_path)
  hostcall.barrier()
  f(2.0)  # compiled for the first run: its rows, never refused
  hostcall.barrier()
  assert _lines(first / "metrics.jsonl") == [{"step": 0, "loss": 1.0},
                                             {"step": 1, "loss": 2.0}]
  # The first run open, and the last.
  assert _files_open_in(tmp_path) == 2 and _open_fds() <= before + 1
  del f
  hostcall.barrier()  # (the program's call site released)
  metrics.Run("kept", root=tmp_path, writers=["memory"]).close()
  assert _files_open_in(tmp_path) == 1  # the first is finished now
  cell["run"].close()
  assert _files_open_in(tmp_path) == 0


def test_a_run_dropped_with_a_row_in_flight_is_finished_once_it_is_written(
    tmp_path):
  entered, gate = threading.Event(), threading.Event()

  def hold(*_):
    entered.set()
    gate.wait(60)

  jax.jit(lambda x: hcb.id_tap(hold, x, delivery="async"))(0.0)
  assert entered.wait(60)  # the queue's thread delivers nothing else now
  run = metrics.Run("late", root=tmp_path)
  run.log(0, loss=1.5)  # queued behind the tap that waits
  del run
  again = metrics.Run("late", root=tmp_path)  # the first is left open
  gate.set()
  hostcall.barrier()  # its row written, then it is finished
  assert _lines(tmp_path / "late" / "metrics.jsonl") == [
      {"step": 0, "loss": 1.5}]
  again.close()
