"""Helpers that several test modules share (a test module never imports
another test module)."""

import os
import pathlib
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

ROOT = pathlib.Path(__file__).parent.parent


def free_port() -> int:
  """A TCP port of 127.0.0.1 free now (for a jax.distributed
  coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_python_processes(script: str, argvs: list[list[str]],
                         at_once: bool = False,
                         timeout: float = 180) -> list[str]:
  """Runs ``script`` (Python source) in one process per argument list
  (``sys.argv[1:]``); returns each one's stdout, once all have exited with
  status 0 (else the test fails with the stderr of the first that did
  not).

  ``at_once``: the processes start their work together: each prints
  ``ready`` once imported (``print("ready", flush=True)``) and then reads a
  line from stdin, which they are all sent once every one is ready (no
  sleep: the slowest to start decides when).
  """
  procs = [subprocess.Popen([sys.executable, "-c", script, *map(str, argv)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
           for argv in argvs]
  outputs = []
  try:
    if at_once:
      for p in procs:
        line = p.stdout.readline()
        if line != "ready\n":
          p.kill()
          pytest.fail(f"a process did not get ready: {line!r}\n"
                      f"{p.stderr.read()[-4000:]}")
      for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
      outputs.append(p.communicate(timeout=timeout))
  except subprocess.TimeoutExpired:
    pytest.fail("a process did not finish in time")
  finally:
    for p in procs:  # a failed or hung peer never outlives the test
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, (p, (out, err)) in enumerate(zip(procs, outputs)):
    assert p.returncode == 0, f"process {i}:\n{err[-4000:]}"
  return [out for out, _ in outputs]


def run_python(code: str, timeout: float = 120, env=None, check=True):
  """Runs ``code`` in a fresh interpreter (in the repository's root); a
  hang is a test failure. With ``check``, a non-zero exit fails the test
  with the end of its output."""
  proc = subprocess.run(
      [sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
      text=True, timeout=timeout, cwd=ROOT,
      env={**os.environ, **(env or {})})
  if check:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return proc


def wait_for(condition, timeout=30.0):
  """Waits until ``condition()`` holds (checked on a short period); fails
  the test after ``timeout`` seconds. For a state another thread reaches
  with no event to wait on (a thread blocked in the queue)."""
  event = threading.Event()
  deadline = timeout
  while not condition():
    assert deadline > 0, "condition not reached"
    event.wait(0.01)
    deadline -= 0.01


class FirstCallWaits:
  """A host function (``int32`` in, the same out) whose first call tells
  ``entered`` and waits for ``release``: a computation held in its loop
  while another thread acts."""

  def __init__(self):
    self.entered, self.release = threading.Event(), threading.Event()

  def __call__(self, value):
    import numpy as np
    if not self.entered.is_set():
      self.entered.set()
      self.release.wait(60)
    return np.asarray(value, np.int32)


class FakeCoordinationClient:
  """The part of jax.distributed's client a gathered run uses: a key-value
  store whose blocking get waits (on a condition, never a sleep) and times
  out as the coordination service does."""

  def __init__(self):
    self.values, self.deleted = {}, []
    self.changed = threading.Condition()

  def key_value_set_bytes(self, key, value):
    with self.changed:
      assert key not in self.values, f"{key} set twice"
      self.values[key] = value
      self.changed.notify_all()

  def blocking_key_value_get_bytes(self, key, timeout_in_ms):
    with self.changed:
      if not self.changed.wait_for(lambda: key in self.values,
                                   timeout_in_ms / 1000):
        raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out "
                           f"with key: {key}")
      return self.values[key]

  def key_value_delete(self, key):
    with self.changed:
      del self.values[key]
      self.deleted.append(key)


def tqdm_postfix(ordered_dict=None, **values) -> str:
  """The postfix real tqdm shows after ``bar.set_postfix(ordered_dict,
  **values)``: what hostcall's bars must show for the same values."""
  import io
  import tqdm
  bar = tqdm.tqdm(total=1, file=io.StringIO())
  bar.set_postfix(ordered_dict, refresh=False, **values)
  text = bar.postfix
  bar.close()
  return text


def tqdm_lines(**options) -> str:
  """What real tqdm writes for a bar of ``options`` closed at once (a loop
  of no step): hostcall's bar of the same loop writes the same."""
  import io
  import tqdm
  out = io.StringIO()
  tqdm.tqdm(file=out, **options).close()
  return out.getvalue()


def wandb_records(sync_file) -> list[dict]:
  """The records of an offline W&B run's file (its run's
  ``settings.sync_file``), as wandb's own reader prints them (``wandb leet
  inspect --json``): ``{"type": "history" | "run" | "config" | ..., ...}``."""
  import json
  log = pathlib.Path(sync_file)
  assert log.is_absolute() and log.exists(), log
  done = subprocess.run(
      [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
      capture_output=True, text=True, timeout=120, check=True)
  return [json.loads(line) for line in done.stdout.splitlines()
          if line.startswith("{")]


def tensorboard_events(logdir) -> list:
  """The events of a TensorBoard log directory's event files, parsed with
  the protobufs tensorboardX ships (``tensorboard``, whose reader this
  stands for, is not a test extra): each file a sequence of records,
  ``length (uint64), its CRC (uint32), data, its CRC (uint32)``."""
  import struct
  from tensorboardX.proto import event_pb2
  events = []
  for path in sorted(pathlib.Path(logdir).glob("events.out.tfevents.*")):
    data, at = path.read_bytes(), 0
    while at < len(data):
      (size,) = struct.unpack("<Q", data[at:at + 8])
      event = event_pb2.Event()
      event.ParseFromString(data[at + 12:at + 12 + size])
      events.append(event)
      at += 12 + size + 4
  return events


class HeldConsumer:
  """Holds hostcall's delivery thread until a program has queued all its
  calls, so that they come in one interleaved batch
  (``hostcall._runtime.interleaved``), and counts the calls of each such
  batch delivered (``batches``)."""

  def __init__(self, monkeypatch):
    import numpy as np
    import hostcall
    from hostcall._runtime import interleaved
    self.batches = []
    self.gate = threading.Event()
    deliver = interleaved.deliver

    def counted(batch, *args):
      self.batches.append(len(batch))
      return deliver(batch, *args)
    monkeypatch.setattr(interleaved, "deliver", counted)
    hold = hostcall.jit(
        lambda x: hostcall.debug_callback(lambda _: self.gate.wait(60), x))
    self._hold = lambda: hold(np.float32(0))

  def run(self, program, *args, barrier: bool = True):
    """``program(*args)`` with its calls queued while the consumer waits;
    then a barrier (with ``barrier``)."""
    import jax
    import hostcall
    self.gate.clear()
    self._hold()
    try:
      jax.block_until_ready(program(*args))
    finally:
      self.gate.set()
    if barrier:
      hostcall.barrier()
