"""``Run``: a named run, and ``Run.log``, which stages one asynchronous tap.

On the host the values become a ``Block`` (``log_target.py``, one row per
step and vmap member) that the run's sink (``sink.py``) puts on the writer
thread (``writer_thread.py``), which hands it to each writer. Inside
``hostcall.scan`` (and the progress loops built on it) the tap is buffered:
one host call brings ``every`` steps, written as one block.
"""

from __future__ import annotations

import logging
import os
import pathlib
from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from hostcall import _jax_private
from hostcall._apps.metrics import (config as _config, files, log_args,
                                    open_runs, processes as _processes,
                                    reading, registry)
from hostcall._apps.metrics.log_target import LogTarget
from hostcall._apps.metrics.memory import MemoryWriter
from hostcall._apps.metrics.sink import RunSink
from hostcall._apps.metrics.writer import Writer
from hostcall._runtime import tap_queue as _queue
from hostcall._core import bind
from hostcall._core.context import why_waiting_is_forbidden
from hostcall._core.checks import is_array_like
from hostcall._flavours.grad import on_backward

logger = logging.getLogger("hostcall")


#: What ``Run(exists=...)`` takes: what a run does where its directory
#: already exists (an earlier run's) or is an open run's of this process.
EXISTS = {
    "new": "a directory of its own, <name>-2, <name>-3, ... (the default)",
    "append": "go on after the earlier rows, in the same files",
    "overwrite": "start the files afresh (the earlier rows are lost)",
}


_INDEX_COLUMNS = frozenset({"member", "device", "process"})

#: What ``Run.log_grad`` may log of each cotangent, and how.
GRAD_STATS = ("norm", "min", "max", "nans")


def _grad_stats(cotangent, stats) -> dict:
  """``{stat: value}`` of one named value's cotangent (a pytree): over every
  element of every leaf, in float32 (the norm from a sum of squares)."""
  leaves = [jnp.ravel(jnp.asarray(leaf)) for leaf in
            jax.tree_util.tree_leaves(cotangent)]
  flat = jnp.concatenate(leaves) if len(leaves) > 1 else leaves[0]
  if jnp.iscomplexobj(flat):
    magnitude = jnp.abs(flat).astype(jnp.float32)
  else:
    magnitude = flat.astype(jnp.float32)
  out = {}
  for stat in stats:
    if stat in ("min", "max") and flat.size == 0:
      out[stat] = jnp.float32(jnp.nan)  # an empty value has no extremes
    elif stat == "norm":
      out[stat] = jnp.sqrt(jnp.sum(jnp.square(jnp.abs(magnitude))))
    elif stat == "min":
      out[stat] = jnp.min(magnitude)
    elif stat == "max":
      out[stat] = jnp.max(magnitude)
    else:  # "nans"
      out[stat] = jnp.sum(jnp.isnan(flat)).astype(jnp.int32)
  return out


class Run:
  """A named run whose metrics are logged from inside ``jit``, ``scan``,
  ``vmap`` and ``grad``, without the device waiting for the disk.

  Arguments:
    name: the run's name, a relative path; files go to ``<root>/<name>/``
      (or ``<root>/<name>-2/``, ...: see ``exists``).
    root: the directory of runs (default ``runs``).
    writers: where rows go: ``"jsonl"`` (``metrics.jsonl``, the default),
      ``"csv"`` (``metrics.csv``), ``"tensorboard"`` (event files in
      ``tensorboard/``, needs ``tensorboardX``), ``"memory"`` (kept for
      ``dataframe()``), ``"mlflow"`` (an MLflow run, needs ``mlflow``),
      ``"wandb"`` (a Weights & Biases run, needs ``wandb``),
      ``hostcall.metrics.Writer`` instances, or CLU ``MetricWriter``s (any
      object with ``write_scalars(step, scalars)``, ``flush()``,
      ``close()``).
    params: hyper-parameters (a dict of JSON values), the run's first
      ``config``: every writer keeps it (``config.json`` beside the file
      writers' rows, the MLflow run's parameters, the W&B run's config,
      TensorBoard's hparams, a CLU writer's ``write_hparams``).
    processes: in a job of several processes (``jax.distributed``), who
      writes: ``"each"`` (the default: every process writes its own rows,
      to ``<root>/<name>/process_<k>/`` and its own MLflow / W&B run,
      named ``<name>/process_<k>``),
      ``"gather"`` (only process 0's writers write, every process's rows,
      the others' sent to it through JAX's coordination service; process
      0's ``close()`` waits for the others to close theirs) or ``"zero"``
      (only process 0 writes, its own rows; the others' are dropped). Rows
      carry the ``process`` that logged them; ``hostcall.metrics.read``
      of the run's directory merges the processes' files. Make runs after
      ``jax.distributed.initialize()``, in the same order in every
      process, and close them before it shuts down.
    exists: what the run does where ``<root>/<name>/`` exists (an earlier
      run's) or is the directory of a run of this process: ``"new"`` (the
      default) writes to a directory of its own, the first free of
      ``<name>-2``, ``<name>-3``, ... (a warning says where; ``run.dir`` is
      it), claimed by ``os.mkdir``, so that no run destroys an earlier one's
      rows and runs made at once (in threads, in processes) never share
      one; in a job of several processes, process 0 names it for all;
      ``"append"`` goes on after the earlier rows in the same files;
      ``"overwrite"`` starts the files afresh. With ``"append"`` or
      ``"overwrite"`` a run still open in this process with that directory
      is replaced: it is flushed and closed, and whatever still logs to the
      old object (a function compiled before) logs to the new run.

  Attributes:
    name: the run's name.
    dir: the directory its files go to (``pathlib.Path``).
    id: a number no other run of this process has.
    writers: its writers (the named ones made).
    config: its config (``Run(params=...)``, updated as ``wandb.config``
      is: ``run.config.update({...})``).

  A run that fails to open (a writer whose extra is missing, a tracking
  tool that refuses to start, a directory that cannot be made) changes
  nothing: no run is replaced, and the writers it made are closed. Rows
  reach the files at every
  ``hostcall.barrier()``, ``run.flush()``, ``run.close()`` and at exit. A
  run nothing can log to any more (its ``Run`` object gone, every program
  compiled with its ``log`` calls gone, its rows delivered) is finished,
  flushed and closed, when a run is made and at each barrier: a notebook
  cell run again (``run = Run("fit")``) leaves one run open, not one a
  time.
  Under ``vmap`` each member's values form their own row, with its
  ``member`` index (row-major over nested vmaps). Where JAX sees several
  devices, rows carry the ``device`` id that logged them (under
  ``shard_map`` and ``pmap`` each device logs its own values), and in a job
  of several processes the ``process`` (see ``processes``).

  ``Run.records()``, ``dataframe()`` and ``hostcall.metrics.read`` join
  the rows of one step (and member, device, process) that different calls
  logged (``log`` and ``log_grad``, say) into one row; a metric logged
  twice at one step keeps both values, in two rows. The files hold the
  rows as logged, one a call.

  Example:
    >>> import jax, jax.numpy as jnp, hostcall
    >>> run = hostcall.metrics.Run("doc", writers=["memory"])
    >>> def step(w, x):
    ...   loss = (w * x - 1.0) ** 2
    ...   run.log(loss=loss)
    ...   return w - 0.1 * jax.grad(lambda w: (w * x - 1.0) ** 2)(w), loss
    >>> _ = jax.jit(lambda w: jax.lax.scan(step, w, jnp.ones(3)))(0.0)
    >>> run.dataframe()
       step    loss
    0     0  1.0000
    1     1  0.6400
    2     2  0.4096
  """

  def __init__(self, name: str = "run", root: str | os.PathLike = "runs",
               writers: Iterable = ("jsonl",), params: dict | None = None,
               processes: str = "each", exists: str = "new"):
    if isinstance(writers, str) or not isinstance(writers, Iterable):
      writers = [writers]
    writers = list(writers)
    if params is not None and not isinstance(params, dict):
      raise TypeError(f"Run(params=...) is a dict of hyper-parameters, e.g. "
                      f"params={{'lr': 0.1}}; got {params!r} of type "
                      f"{type(params).__name__}.")
    params = _config.as_dict(params or {}, "Run(params=...)")
    processes = _processes.check_mode(processes)
    if not isinstance(exists, str) or exists not in EXISTS:
      raise ValueError(
          f"Run(exists=...) is one of {sorted(EXISTS)} ("
          f"{'; '.join(f'{k!r}: {v}' for k, v in EXISTS.items())}); got "
          f"{exists!r}.")
    job = _processes.job()
    self.name = name
    base = files.run_dir(root, name)
    open_runs.finish_abandoned()  # (an earlier run of this name, made again)
    part = (f"process_{job.process}"
            if job.process is not None and processes == "each" else None)
    channel = None if job.process is None else _processes.channel(name)
    writes = any(registry.writes_files(w) for w in writers)
    claimed = None
    if exists != "new":
      self.dir = base
    elif job.process is None:
      self.dir = claimed = files.claim_run_dir(base, writes,
                                               open_runs.dirs_in_use)
    else:  # one name for the whole job: process 0's
      def choose() -> str:
        nonlocal claimed
        claimed = files.claim_run_dir(base, writes, open_runs.dirs_in_use)
        return claimed.name
      self.dir = base.with_name(_processes.one_name(
          job, channel, choose, f"Run({name!r})"))
    if self.dir != base:
      logger.warning(
          "hostcall: %s holds an earlier run's files (or an open run's), so "
          "Run(%r) writes to %s (run.dir); pass exists='append' to go on "
          "with them, or exists='overwrite' to start them afresh.", base,
          name, self.dir)
    made = writes and claimed == self.dir
    try:  # (a directory made for it is removed if it fails to open)
      if part:  # (in a directory process 0 named, new where "new")
        self.dir = self.dir / part
        made = writes and exists == "new" and files.make_own_part(self.dir)
      if exists == "append":  # the earlier run's config, then this one's
        params = {**_config.read_config(self.dir / _config.FILE), **params} \
            if (self.dir / _config.FILE).is_file() else params
      self._sink = RunSink(name, self.dir, writers, params=params,
                           processes=processes, job=job, exists=exists,
                           channel=channel, owner=self, dir_made=made)
    finally:
      if claimed is not None:
        files.release_run_dir(claimed)
    self.id = self._sink.id
    self.writers: list = self._sink.writers
    self._config = _config.Config(self._sink.current)

  @property
  def config(self) -> _config.Config:
    """The run's config, as W&B's ``wandb.config``: ``Run(params=...)``,
    then what ``run.config.update({...})`` (or ``run.config["k"] = v``)
    adds; every writer keeps it (``config.json`` beside the rows, MLflow's
    parameters, W&B's config, TensorBoard's hparams), and
    ``hostcall.metrics.read_config`` reads it back. A key's value is
    refused a change unless ``allow_val_change=True``.

    Example:
      >>> import hostcall, tempfile
      >>> run = hostcall.metrics.Run("doc-config", root=tempfile.mkdtemp(),
      ...                            params={"lr": 0.1})
      >>> run.config.update({"batch": 32}); run.config.lr
      0.1
      >>> run.close(); (run.dir / "config.json").exists()
      True
    """
    return self._config

  def __repr__(self):
    return f"hostcall.metrics.Run({self.name!r}, dir={str(self.dir)!r})"

  def log(self, *args, step=None, **metrics) -> None:
    """Logs ``metrics`` (scalars or small arrays) at ``step``.

    Arguments:
      *args: the step, a dict of metrics, or both: ``run.log(step,
        loss=loss)``, ``run.log({"loss": loss}, step=step)`` (W&B's form),
        ``run.log({"loss": loss})`` or ``run.log(step, {"loss": loss})``.
      step: the step number (an integer scalar, traced or not; under
        ``vmap``, one per member), positional or ``step=``; None numbers
        the calls of this run on the host 0, 1, 2, ...
      **metrics: name=value; JAX arrays, NumPy arrays of numbers or
        booleans, Python numbers, text (``str``, known when the call is
        traced: it stays on the host), or dicts of them, whose keys are
        joined by ``.`` as W&B names them (``{"train": {"loss": l}}`` is
        the metric ``train.loss``). Any string but
        ``step``, ``member``, ``device`` and ``process`` (columns hostcall
        fills) is a valid name for the file writers; a tracking tool's
        writer refuses, when the call is traced, names its tool does not
        take (MLflow: ``"acc@1"``, say), and a writer that cannot keep text
        refuses text, saying which and why. A name given
        in the dict and as name=value is refused.

    Works inside and outside ``jit``; returns nothing. The values reach the
    writers asynchronously (see ``hostcall.set_delivery``).
    """
    self._sink.refuse_in_a_forked_child("log to it")
    step, metrics, paths = log_args.metrics_of(args, step, metrics)
    sink = self._sink.current()
    if sink.closed:
      raise RuntimeError(f"{sink!r} is closed; open a new Run to log more.")
    if not metrics:
      raise TypeError("Run.log needs at least one metric, e.g. "
                      "run.log(step, loss=loss) or run.log({'loss': loss}, "
                      "step=step).")
    reserved = sorted(set(metrics) & _INDEX_COLUMNS)
    if reserved:
      raise ValueError(
          f"the metric name(s) {reserved} are columns hostcall fills itself "
          "(the vmap member, the device and the process of each row); "
          f"choose another name, e.g. run.log({reserved[0]}_id=...).")
    values, texts = log_args.split_texts(metrics)
    names = tuple(values)
    operands = [jnp.asarray(v) for v in values.values()]
    shapes = {n: tuple(v.shape) for n, v in zip(names, operands)}
    sink.check_metrics({n: shapes.get(n, ()) for n in metrics}, texts, paths)
    if step is not None:
      log_args.check_step(step, "run.log(step, loss=...)")
      operands.insert(0, jnp.asarray(step))
    if not operands:  # texts alone: one byte, which a loop buffers (and
      operands = [jnp.zeros((), jnp.int8)]  # the host reads no value of)
    # A call outside jit is counted until delivered; a call site traced
    # into a program logs to the run while that program lives.
    eager = _jax_private.is_top_level()
    log_target = LogTarget(sink, sink.id, names, step is not None, eager,
                           texts=tuple(texts.items()), order=tuple(metrics))
    if eager:
      sink.users.eager_calls(1)
    else:
      sink.users.add(log_target)
    try:
      bind(operands, target=log_target, kind="call")
    except BaseException:
      if eager:  # (not dispatched)
        sink.users.eager_calls(-1)
      raise

  def log_grad(self, step=None, *, stats: Iterable[str] = ("norm",),
               **named) -> Any:
    """Returns the named values unchanged and, where the program is
    differentiated, logs statistics of the cotangent reaching each of them
    from the backward pass, into this run (per-layer gradient norms without
    returning them).

    Arguments:
      step: the step number (an integer scalar, traced or not), saved by
        the forward pass; None numbers the rows on the host, as for
        ``log``.
      stats: which statistics of each cotangent to log, among ``"norm"``
        (the Euclidean norm over every element of the value, a pytree
        included), ``"min"``, ``"max"`` (NaN for a value with no
        elements) and ``"nans"`` (how many elements are NaN); column
        ``grad_<stat>/<name>``.
      **named: name=value: the float values (arrays or pytrees of them)
        whose cotangents to watch.

    Returns:
      The value, if one was named; else a tuple of the values, in the
      order named.

    One row per backward pass (and ``vmap`` member), written when the
    cotangents are complete: a loop's steps last first. The forward pass
    logs nothing, and a program that is not differentiated logs nothing.
    See ``hostcall.grad_callback`` for ``vmap``, second order, checkpoint
    and forward mode.

    Example:
      >>> import jax, jax.numpy as jnp, hostcall
      >>> run = hostcall.metrics.Run("doc-grad", writers=["memory"])
      >>> def loss(w, step):
      ...   w = run.log_grad(step, w=w)
      ...   return jnp.sum(w ** 2)
      >>> _ = jax.jit(jax.grad(loss))(jnp.array([3.0, 4.0]), 0)
      >>> run.records()
      [{'step': 0, 'grad_norm/w': 10.0}]
    """
    self._sink.refuse_in_a_forked_child("log to it")
    stats = (stats,) if isinstance(stats, str) else tuple(stats)
    unknown = [s for s in stats if s not in GRAD_STATS]
    if unknown or not stats:
      raise ValueError(f"log_grad's stats= are among {GRAD_STATS}, got "
                       f"{stats!r}: e.g. stats=('norm', 'nans').")
    if not named:
      raise TypeError("Run.log_grad needs at least one named value, e.g. "
                      "h = run.log_grad(step, layer1=h).")
    if self._sink.current().closed:
      raise RuntimeError(f"{self._sink.current()!r} is closed; open a new "
                         "Run to log more.")

    def stage(cotangents, saved_step):
      metrics = {}
      for name, cotangent in zip(named, cotangents):
        for stat, value in _grad_stats(cotangent, stats).items():
          metrics[f"grad_{stat}/{name}"] = value
      self.log(saved_step, **metrics)

    if step is not None:
      log_args.check_step(step, "run.log_grad(step, w=w)")
    values = tuple(named.values())
    for name, value in named.items():
      leaves = jax.tree_util.tree_leaves(value)
      if not leaves or not all(
          is_array_like(v) and jnp.issubdtype(jnp.result_type(v),
                                              jnp.inexact) for v in leaves):
        raise TypeError(
            f"log_grad: {name!r} must be a float array (or a pytree of "
            f"them), a value a gradient flows through; got "
            f"{log_args.describe(leaves[0]) if leaves else repr(value)}.")
    out = on_backward(values, step, stage)
    return out[0] if len(out) == 1 else tuple(out)

  def flush(self) -> None:
    """Waits for the computations running, then writes every row logged so
    far to the writers' files."""
    self._sink.refuse_in_a_forked_child("flush it")
    inside = why_waiting_is_forbidden()
    if inside is not None:
      raise RuntimeError(
          f"Run.flush() / close() / dataframe() was called from inside "
          f"{inside}, where it would wait for the computation (or thread) "
          "running it. Call it after the JAX call returns.")
    _queue.wait()
    self._sink.current().drain()

  def close(self) -> None:
    """Flushes and closes the writers; later ``log`` calls raise. In a
    child forked after the run opened, does nothing: the parent closes it
    (a ``with`` block the fork happened in ends in both)."""
    sink = self._sink.current()
    if sink.closed or self._sink.in_a_forked_child:
      return
    self.flush()
    sink.close()

  def __enter__(self) -> "Run":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def records(self) -> list[dict[str, Any]]:
    """Every row logged so far, as dicts (after a flush), the rows of one
    step that different calls logged joined (``log`` and ``log_grad`` at
    one step are one row; a metric logged twice at one step keeps both
    values, in two rows).

    Returns:
      One dict a row: ``step`` (and ``process``, ``member``, ``device``
      where logged), then the metrics.
    """
    self.flush()
    sink = self._sink.current()
    for writer in sink.writers:
      if isinstance(writer, MemoryWriter):
        return reading.merge_rows(writer.records())
    return reading.read_records(sink.dir)

  def dataframe(self):
    """Every row logged so far as a pandas DataFrame (after a flush)."""
    return reading.to_dataframe(self.records())

  def latest(self, name: str) -> tuple[int, Any] | None:
    """``(step, value)`` of the last row logged with metric ``name`` that
    has reached the host, or None; never waits (for a ``stop_when``
    predicate, say).

    Example:
      >>> import jax, hostcall
      >>> run = hostcall.metrics.Run("doc-latest", writers=["memory"])
      >>> _ = jax.jit(lambda: [run.log(i, loss=1.0 / (i + 1)) for i in range(3)])()
      >>> hostcall.barrier(); run.latest("loss")
      (2, 0.3333333...)
    """
    if not isinstance(name, str):
      raise TypeError(f"Run.latest takes a metric's name (a str, as given to "
                      f"run.log), got {name!r} of type "
                      f"{type(name).__name__}.")
    found = self._sink.current().latest.get(name)
    if found is None:
      return None
    step, value = found
    value = np.asarray(value)
    return step, value.item() if value.ndim == 0 else value
