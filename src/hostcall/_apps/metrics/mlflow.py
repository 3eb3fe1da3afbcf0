"""``MlflowWriter``: a run's rows as the metrics of one MLflow run, through
``mlflow`` (the ``mlflow`` extra), imported when a writer is made
(``Run(writers=["mlflow"])``)."""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import posixpath
import re
import sqlite3
import time
from typing import Any, Mapping

from hostcall._apps.metrics import config as _config, keys, registry
from hostcall._apps.metrics.block import Block
from hostcall._apps.metrics.writer import Writer

logger = logging.getLogger("hostcall")


def _said(exc: BaseException) -> str:
  """What ``exc`` says, on one line, cut short (a database's error repeats
  its SQL)."""
  text = " ".join(str(exc).split())
  return f"{type(exc).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


# MLflow's rule for the names of metrics and parameters (as
# mlflow.utils.validation has it, colons allowed: they are but on Windows),
# and its bounds on a key's length and a parameter's value.
_NAME_CHARACTERS = re.compile(r"[/\w.\- :]*")
MAX_KEY_LENGTH = 250
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
#: The most parameters or tags one ``log_batch`` call takes (MLflow's).
MAX_PARAMS_TAGS = 100
RULE = ("MLflow's names may only contain letters, digits, underscores (_), "
        "dashes (-), periods (.), spaces, colons (:) and slashes (/), must "
        "read the same as a normalised path (no leading '/', '//', './' or "
        f"'..'), and are at most {MAX_KEY_LENGTH} characters")


def refusal(name: str) -> str | None:
  """Why MLflow refuses ``name`` as a metric's or parameter's key, or None.

  Example:
    >>> from hostcall._apps.metrics.mlflow import refusal
    >>> refusal("loss/member_0") is None, refusal("acc@1")
    (True, "'@' is not among the characters MLflow takes")
  """
  bad = sorted({c for c in name if not _NAME_CHARACTERS.fullmatch(c)})
  if bad:
    return (f"{', '.join(map(repr, bad))} "
            f"{'is' if len(bad) == 1 else 'are'} not among the characters "
            "MLflow takes")
  normal = posixpath.normpath(name) if name else "."
  if normal != name or normal == "." or normal.startswith(("..", "/")):
    return f"MLflow would read it as the path {normal!r}"
  if len(name) > MAX_KEY_LENGTH:
    return (f"it has {len(name)} characters, more than MLflow's "
            f"{MAX_KEY_LENGTH}")
  return None


def _param_text(value) -> str:
  """A parameter's value as MLflow keeps it: text (a config's JSON values
  as JSON, text as it is)."""
  return value if isinstance(value, str) else (
      _config.as_text(value) if isinstance(value, (list, dict, type(None)))
      else str(value))


def _check_params(params: Mapping[str, Any],
                  logged: Mapping[str, str] | None = None) -> None:
  """Refuses parameters MLflow would refuse (which would lose them all):
  names it does not take, values too long, and a new value of a parameter
  ``logged`` before (MLflow keeps a parameter's first value)."""
  for key, value in params.items():
    why = refusal(str(key))
    text = _param_text(value)
    if why is None and len(text) > MAX_PARAM_VALUE_LENGTH:
      why = (f"its value has {len(text)} characters, more than "
             f"MLflow's {MAX_PARAM_VALUE_LENGTH}")
    if why is not None:
      raise ValueError(
          f"the MLflow writer refuses the parameter {str(key)!r}: {why}. "
          f"{RULE}. Rename it (e.g. {_renamed(str(key))!r}) or leave it out "
          "of params= (or of run.config).")
    if logged and logged.get(key, text) != text:
      raise ValueError(
          f"the MLflow writer refuses to change the parameter {key!r} from "
          f"{logged[key]!r} to {text!r}: an MLflow run keeps a parameter's "
          "first value. Set another key, or start another Run.")


def _sqlite_file(uri: str):
  """The file of an SQLite tracking store's URI (``sqlite:///path``), or
  None for another store (or an in-memory database)."""
  if not uri.startswith("sqlite:"):
    return None
  from sqlalchemy.engine import make_url  # mlflow's extra installs it
  database = make_url(uri).database
  return None if database in (None, "", ":memory:") else pathlib.Path(
      database)


def _probe_sqlite(uri: str) -> None:
  """Opens the SQLite tracking store of ``uri`` once, and raises what
  SQLite says where it cannot (a read-only directory, a directory where
  the file should be): MLflow would instead retry for 100 s before it
  raised. A store that is not SQLite is left to MLflow."""
  path = _sqlite_file(uri)
  if path is None:
    return
  path.parent.mkdir(parents=True, exist_ok=True)  # as MLflow does
  with contextlib.closing(sqlite3.connect(path, timeout=5)) as db:
    db.execute("PRAGMA schema_version").fetchall()


def _renamed(name: str) -> str:
  """``name`` with what MLflow refuses replaced by ``_``."""
  name = "".join(c if _NAME_CHARACTERS.fullmatch(c) else "_" for c in name)
  return posixpath.normpath(name).lstrip("/").replace("..", "__")[
      :MAX_KEY_LENGTH] or "_"


class MlflowWriter(Writer):
  """The rows of a run as the metrics of one MLflow run (the ``mlflow``
  extra), logged to the tracking store the user has set
  (``MLFLOW_TRACKING_URI`` or ``mlflow.set_tracking_uri``), or to
  ``tracking_uri``.

  What ``Run(writers=["mlflow"])`` makes, with the hostcall run's name as
  the MLflow run's name and the run's ``params`` as its parameters. Each
  block of rows the writer thread hands over is one ``log_batch`` call (of
  at most 1000 metrics, MLflow's bound; a larger block is a few calls), on
  the writer thread, never one call per row. Metrics are keyed by name and
  step; a vmap member's value is its own key, ``<name>/member_<k>`` (and
  ``/device_<d>``, ``/process_<p>`` before it where rows have them), in the
  one MLflow run; an array metric is one key per element, ``<name>/0``,
  ``<name>/1``, ... A key logged several times at one step (a step logged
  again) keeps each value, in the order logged, in its history.

  A text value is a tag of the run (its last value: a tag holds one). The
  run's config is its parameters, nested keys joined by ``.``, values as
  text; a key added later is a parameter added then, and a new value of a
  parameter is refused (an MLflow run keeps a parameter's first value).

  Names MLflow refuses (``"acc@1"``, ``"loss (train)"``: see ``refusal``)
  are refused when ``Run.log`` is traced, and so are parameters it refuses,
  when the writer is made: MLflow would refuse a whole batch for one of
  them.

  A tracking store that cannot be reached or refuses to write (a bad URI,
  a read-only SQLite file) is reported as a full disk is: the failure is
  raised by the next ``hostcall.barrier()`` as
  ``hostcall.CallbackException``, the rows of that block are not in MLflow,
  and the run's other writers still receive every row. A store that cannot
  be reached when the writer is made is tried again at each block. A
  SQLite store's file is opened first by the writer itself, so that one
  that cannot be opened is reported at once (MLflow's engine would retry
  it for 100 s).

  Arguments:
    run_name: the MLflow run's name.
    experiment: the MLflow experiment's name (made where missing); None
      takes ``MLFLOW_EXPERIMENT_NAME``, else MLflow's default experiment.
    tracking_uri: the tracking store; None takes MLflow's (the environment's
      ``MLFLOW_TRACKING_URI`` or ``mlflow.set_tracking_uri``).
    params: hyper-parameters, logged as the run's parameters (values as
      text).
    tags: the run's tags.

  Attributes:
    run_id: the MLflow run's id (None while the store has not answered).
    client: the ``mlflow.MlflowClient`` the writer logs through (None
      while the store's URI is refused).
    tracking_uri: the tracking store's URI.

  Raises:
    ImportError: ``mlflow`` is not installed (``pip install
      'hostcall[mlflow]'``).
    ValueError: a parameter MLflow refuses (its name, or a value longer
      than 6000 characters).

  Example:
    >>> import numpy as np, tempfile, hostcall
    >>> store = "sqlite:///" + tempfile.mkdtemp() + "/mlflow.db"
    >>> writer = hostcall.metrics.MlflowWriter("doc", tracking_uri=store,
    ...                                        params={"lr": 0.1})
    >>> writer.write(hostcall.metrics.Block(
    ...     step=np.array([0, 1]), metrics={"loss": np.array([1.0, 0.5])}))
    >>> writer.close()
    >>> [(m.step, m.value) for m in
    ...  writer.client.get_metric_history(writer.run_id, "loss")]
    [(0, 1.0), (1, 0.5)]
  """

  #: The most metrics one ``log_batch`` call takes (MLflow's bound).
  BATCH = 1000

  def __init__(self, run_name: str | None = None, experiment: str | None = None,
               tracking_uri: str | None = None,
               params: Mapping[str, Any] | None = None,
               tags: Mapping[str, Any] | None = None):
    self._mlflow = registry.import_extra("mlflow", "mlflow")
    self._entities = registry.import_extra("mlflow", "mlflow.entities")
    self._run_name = run_name
    self._experiment = (experiment if experiment is not None
                        else os.environ.get("MLFLOW_EXPERIMENT_NAME"))
    self._params = {str(k): _param_text(v) for k, v in
                    _config.flat(dict(params or {})).items()}
    _check_params(self._params)
    self._logged: dict[str, str] = {}  # the parameters the store has
    self._tags = {str(k): str(v) for k, v in (tags or {}).items()}
    self.tracking_uri = tracking_uri or self._mlflow.get_tracking_uri()
    self.client = None
    self.run_id: str | None = None
    self._failed = False
    try:
      self._start()
    except Exception as exc:  # noqa: BLE001 - reported at the next barrier
      self._failed = True
      self._start_failure: BaseException | None = exc
    else:
      self._start_failure = None

  def __repr__(self):
    return (f"MlflowWriter({self._run_name!r}, "
            f"tracking_uri={self.tracking_uri!r})")

  def _start(self) -> None:
    """Makes the MLflow run (and its experiment) and logs its parameters."""
    _probe_sqlite(self.tracking_uri)
    if self.client is None:
      self.client = self._mlflow.MlflowClient(tracking_uri=self.tracking_uri)
    experiment_id = None
    if self._experiment is not None:
      found = self.client.get_experiment_by_name(self._experiment)
      experiment_id = (found.experiment_id if found is not None else
                       self.client.create_experiment(self._experiment))
    run = self.client.create_run(experiment_id or "0", tags=self._tags,
                                 run_name=self._run_name)
    self.run_id = run.info.run_id
    self._log_params()

  def _log_params(self) -> None:
    """Logs the parameters the store does not have yet."""
    params = [self._entities.Param(k, v) for k, v in self._params.items()
              if k not in self._logged]
    for first in range(0, len(params), MAX_PARAMS_TAGS):
      batch = params[first:first + MAX_PARAMS_TAGS]
      self.client.log_batch(self.run_id, params=batch)
      self._logged.update((p.key, p.value) for p in batch)

  def check_config(self, changes: dict[str, Any]) -> None:
    """Refuses a config change MLflow cannot keep: a parameter's name it
    refuses, a value longer than 6000 characters, or a new value of a
    parameter (an MLflow run keeps a parameter's first value).

    Arguments:
      changes: the config's keys that change, and their values.

    Raises:
      ValueError: naming the parameter and why.
    """
    _check_params({k: _param_text(v) for k, v in
                   _config.flat(changes).items()}, self._params)

  def write_config(self, config: dict[str, Any]) -> None:
    """Logs the config's keys that are not parameters of the MLflow run
    yet as its parameters (nested keys joined by ``.``, values as text);
    where the store has not answered yet, when it does."""
    for key, value in _config.flat(config).items():
      self._params.setdefault(key, _param_text(value))
    if self.run_id is not None:
      try:
        self._log_params()
      except Exception as exc:
        self._failed = True
        raise RuntimeError(
            f"MLflow tracking store {self.tracking_uri!r} refused the "
            f"parameters of run {self.run_id} ({_said(exc)}). Check that "
            "the store is reachable and writable.") from exc

  def check_texts(self, texts: dict[str, str]) -> None:
    """Refuses, when ``Run.log`` is traced, a text MLflow cannot keep as a
    tag: longer than 8000 characters, or named as MLflow's own tags
    (``mlflow.*``). Its name is checked as a metric's is.

    Raises:
      ValueError: naming the text and why.
    """
    for name, text in texts.items():
      why = None
      if name.startswith("mlflow."):
        why = ("MLflow keeps its own tags under 'mlflow.' (the run's name, "
               "user, source, ...), and this one would overwrite one")
      elif len(text) > MAX_TAG_VALUE_LENGTH:
        why = (f"it has {len(text)} characters, more than an MLflow tag's "
               f"{MAX_TAG_VALUE_LENGTH}")
      if why is not None:
        raise ValueError(
            f"the MLflow writer refuses the text {name!r}: {why}. MLflow "
            "keeps a text value as a tag of the run. Rename it, or log it "
            "without the MLflow writer.")

  def check_metrics(self, shapes: dict[str, tuple]) -> None:
    """Refuses, when ``Run.log`` is traced, names MLflow refuses and an
    array metric beside a metric named as one of its elements' keys.

    Arguments:
      shapes: ``{name: shape}`` of the call's metrics.

    Raises:
      ValueError: naming the metric and MLflow's rule.
    """
    for name in shapes:
      why = refusal(name)
      if why is not None:
        raise ValueError(
            f"the MLflow writer refuses the metric name {name!r}: {why}. "
            f"{RULE}; one name it refuses would cost MLflow every metric "
            f"of the block. Rename it, e.g. {_renamed(name)!r}.")
    keys.check_collisions(shapes, "MLflow")

  def write(self, block: Block) -> None:
    """Logs the rows of ``block`` as metrics at their steps, in
    ``log_batch`` calls of at most ``BATCH`` metrics.

    Arguments:
      block: the rows to log.

    Raises:
      Exception: whatever the tracking store raised (reported at the next
        barrier; the run's other writers are not affected).
    """
    if self.run_id is None:  # the store did not answer when made: again
      failure, self._start_failure = self._start_failure, None
      try:
        self._start()
      except Exception as exc:
        raise RuntimeError(
            f"MLflow tracking store {self.tracking_uri!r} could not "
            f"start a run ({_said(exc)}); {len(block)} "
            "row(s) were not logged to MLflow (the run's other writers have "
            "them). Check the URI (MLFLOW_TRACKING_URI) and that the store "
            "is reachable and writable.") from (failure or exc)
    timestamp = int(time.time() * 1000)
    Metric = self._entities.Metric
    metrics, texts = [], {}
    for step, scalars in keys.steps(block):
      for key, value in scalars.items():
        if isinstance(value, str):
          texts[key] = value  # a tag keeps one value: the last
        else:
          metrics.append(Metric(key, float(value), timestamp, step))
    self._log(metrics, texts)

  def _log(self, metrics: list, texts: dict[str, str]) -> None:
    """Logs ``metrics`` and then ``texts`` as tags, in batches."""
    tags = [self._entities.RunTag(k, v) for k, v in texts.items()]
    first = 0
    try:
      for first in range(0, len(metrics), self.BATCH):
        self.client.log_batch(self.run_id,
                              metrics=metrics[first:first + self.BATCH])
    except Exception as exc:
      self._failed = True
      lost = [m.step for m in metrics[first:]]
      raise RuntimeError(
          f"MLflow tracking store {self.tracking_uri!r} refused the metrics "
          f"of steps {min(lost)} to {max(lost)} ({_said(exc)}); "
          f"{len(lost)} metric value(s) are not in MLflow run "
          f"{self.run_id} (the run's other writers have their rows). Check "
          "that the store is reachable and writable.") from exc
    try:
      for first in range(0, len(tags), MAX_PARAMS_TAGS):
        self.client.log_batch(self.run_id,
                              tags=tags[first:first + MAX_PARAMS_TAGS])
    except Exception as exc:
      self._failed = True
      raise RuntimeError(
          f"MLflow tracking store {self.tracking_uri!r} refused the text "
          f"tags {sorted(texts)} ({_said(exc)}); they are not in MLflow run "
          f"{self.run_id} (the run's other writers have their rows).") from exc

  def close(self) -> None:
    """Ends the MLflow run (``FINISHED``, or ``FAILED`` where a block could
    not be logged). Where the store failed before (already reported), a
    failure to end the run is logged, not raised."""
    if self.run_id is None:
      return
    try:
      self.client.set_terminated(self.run_id,
                                 "FAILED" if self._failed else "FINISHED")
    except Exception:
      if not self._failed:
        raise
      logger.warning("hostcall: MLflow run %s could not be ended on a store "
                     "that failed before", self.run_id, exc_info=True)


def for_run(run_dir: pathlib.Path, name: str | None = None,
            params: Mapping[str, Any] | None = None) -> MlflowWriter:
  """The writer of ``Run(writers=["mlflow"])``: an MLflow run named as the
  hostcall run (``name``, else ``run_dir``'s name), with ``params``."""
  return MlflowWriter(run_name=name or run_dir.name, params=params)
