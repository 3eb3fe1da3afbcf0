"""Runs in a job of several processes (``jax.distributed``): who writes
(``Run(processes=...)``), the run's directory named once for the whole job
(``one_name``: process 0 chooses it, the others read it), and the rows of
processes 1, 2, ... sent to process 0 through the key-value store of JAX's
coordination service (``ForwardWriter`` sends, ``Gather`` receives)."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import logging
import threading
import time
from typing import Any, Callable

import numpy as np

from hostcall import _jax_private
from hostcall._apps.metrics.block import Block, plain
from hostcall._apps.metrics.writer import Writer

logger = logging.getLogger("hostcall")

#: ``Run(processes=...)``: what each takes.
MODES = {
    "each": "every process writes its own rows to its own writers "
            "(<root>/<name>/process_<k>/ where there are several)",
    "gather": "only process 0 writes, every process's rows, each with its "
              "process; the others send theirs to it",
    "zero": "only process 0 writes, its own rows; the others' are dropped",
}


@dataclasses.dataclass(frozen=True)
class Job:
  """The processes of the job, as ``jax.distributed`` has them.

  Attributes:
    process: this process's index, or None in a job of one process (rows
      then have no ``process`` column).
    count: how many processes.
    client: the coordination service's client (None in a job of one).
  """

  process: int | None
  count: int
  client: Any = None


def job() -> Job:
  """This job's processes (a job of one where ``jax.distributed`` is not
  initialized)."""
  found = _jax_private.distributed_client()
  if found is None or found[2] <= 1:
    return Job(None, 1)
  client, process, count = found
  return Job(process, count, client)


def check_mode(processes) -> str:
  """``processes`` if it is one of ``MODES``, else a ``ValueError``."""
  # (a list or other unhashable value is refused as a wrong string is)
  if not isinstance(processes, str) or processes not in MODES:
    raise ValueError(
        f"Run(processes=...) is one of {sorted(MODES)} "
        f"({'; '.join(f'{k!r}: {v}' for k, v in MODES.items())}); got "
        f"{processes!r}.")
  return processes


_generations: dict[str, itertools.count] = {}
_generations_lock = threading.Lock()


def channel(name: str) -> str:
  """The key-value prefix of this process's ``name``-th run of that name
  (every process of an SPMD program makes its runs in the same order, so
  that the same run has the same prefix in each)."""
  with _generations_lock:
    generation = next(_generations.setdefault(name, itertools.count()))
  return f"hostcall/metrics/{json.dumps(name)}/{generation}"


#: How long a process other than 0 waits for process 0 to name a run (it
#: makes its runs in the same order, maybe after a longer start).
NAME_TIMEOUT = 300.0
#: How long one wait for the name lasts before it is asked again.
NAME_WAIT_MS = 10_000


def one_name(job: Job, prefix: str, choose: Callable[[], str],
             what: str) -> str:
  """The name of a run, one decision for the whole job: process 0 calls
  ``choose()`` and puts what it returns under ``<prefix>/name`` in the
  coordination service's key-value store; the others wait for it there
  (``NAME_TIMEOUT`` at most). A ``choose()`` that fails fails the run in
  every process.

  Arguments:
    job: the job's processes (several).
    prefix: the run's key prefix (``channel(name)``).
    choose: process 0's decision.
    what: the run, for messages.
  """
  key = f"{prefix}/name"
  if job.process == 0:
    try:
      name = choose()
    except BaseException:
      job.client.key_value_set_bytes(key, b"")  # the others fail as well
      raise
    job.client.key_value_set_bytes(key, name.encode())
    return name
  deadline = time.monotonic() + NAME_TIMEOUT
  while True:
    try:
      data = job.client.blocking_key_value_get_bytes(key, NAME_WAIT_MS)
      break
    except Exception as exc:  # noqa: BLE001
      if ("DEADLINE_EXCEEDED" not in str(exc)
          or time.monotonic() >= deadline):
        raise RuntimeError(
            f"process {job.process} could not learn the directory of {what} "
            f"from process 0, which names it for the whole job ({exc}); "
            "make runs in the same order in every process, after "
            "jax.distributed.initialize().") from exc
  if not data:
    raise RuntimeError(f"{what} failed to open in process 0, which names "
                       "it for the whole job; see process 0's error.")
  return data.decode()


_END = b"end"


def encode(block: Block) -> bytes:
  """``block`` as bytes (an ``.npz`` without pickles); ``decode`` reads
  it."""
  arrays = {f"m{i}": plain(np.asarray(v))
            for i, v in enumerate(block.metrics.values())}
  arrays["names"] = np.array(list(block.metrics), dtype=str)
  for column in ("step", "member", "device", "process"):
    value = getattr(block, column)
    if value is not None:
      arrays[column] = np.asarray(value)
  out = io.BytesIO()
  np.savez(out, **arrays)
  return out.getvalue()


def decode(data: bytes) -> Block:
  """The block ``encode`` made ``data`` of."""
  with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
    names = arrays["names"].tolist()
    def column(name):
      return arrays[name] if name in arrays.files else None
    return Block(step=arrays["step"],
                 metrics={n: arrays[f"m{i}"] for i, n in enumerate(names)},
                 member=column("member"), device=column("device"),
                 process=column("process"))


class ForwardWriter(Writer):
  """The writer of a process other than 0 in a run with
  ``processes="gather"``: sends each block to process 0, whose ``Gather``
  hands it to that run's writers.

  Arguments:
    client: the coordination service's client.
    prefix: the run's key prefix and this process (``<channel>/<k>``).
  """

  def __init__(self, client, prefix: str):
    self._client = client
    self._prefix = prefix
    self._sent = 0
    self._closed = False

  def __repr__(self):
    return f"ForwardWriter(to process 0, {self._prefix!r})"

  def write(self, block: Block) -> None:
    """Sends ``block`` to process 0.

    Arguments:
      block: the rows to send.
    """
    self._client.key_value_set_bytes(f"{self._prefix}/{self._sent}",
                                     encode(block))
    self._sent += 1

  def close(self) -> None:
    """Tells process 0 that this process's rows are all sent."""
    if not self._closed:
      self._closed = True
      self._client.key_value_set_bytes(f"{self._prefix}/{self._sent}", _END)


class Gather:
  """Process 0's side of a run with ``processes="gather"``: one thread per
  other process takes the blocks it sends, in order, and hands each to
  ``put`` (the run's sink), until that process closes its run.

  Arguments:
    client: the coordination service's client.
    prefix: the run's key prefix (``channel(name)``).
    count: how many processes the job has.
    put: what takes each block received.
  """

  #: How long one wait for a key lasts before it is asked again.
  WAIT_MS = 10_000

  def __init__(self, client, prefix: str, count: int,
               put: Callable[[Block], None]):
    self._client = client
    self._put = put
    self._stop = threading.Event()
    self._threads = [threading.Thread(
        target=self._receive, args=(f"{prefix}/{k}",), daemon=True,
        name=f"hostcall-metrics-gather-{k}") for k in range(1, count)]
    for thread in self._threads:
      thread.start()

  def _receive(self, prefix: str) -> None:
    for number in itertools.count():
      key = f"{prefix}/{number}"
      while True:
        try:
          data = self._client.blocking_key_value_get_bytes(key, self.WAIT_MS)
          break
        except Exception as exc:  # noqa: BLE001
          if self._stop.is_set():
            return
          if "DEADLINE_EXCEEDED" not in str(exc):  # not a wait timed out
            logger.warning("hostcall: metrics rows from %s no longer reach "
                           "process 0 (%s)", prefix, exc)
            return
      try:
        self._client.key_value_delete(key)
      except Exception:  # noqa: BLE001 - the store keeps a key: harmless
        pass
      if data == _END:
        return
      try:
        self._put(decode(data))
      except BaseException:  # noqa: BLE001 - the thread goes on
        logger.exception("hostcall: metrics rows from %s were lost", prefix)

  def wait(self, timeout: float) -> list[int]:
    """Waits until every other process has closed its run, at most
    ``timeout`` seconds; returns the processes not heard to close (their
    threads are stopped)."""
    deadline = time.monotonic() + timeout
    for thread in self._threads:
      thread.join(max(0.0, deadline - time.monotonic()))
    missing = [int(t.name.rpartition("-")[2]) for t in self._threads
               if t.is_alive()]
    self._stop.set()
    return missing
