"""``WandbWriter``: a run's rows as the history of one Weights & Biases run,
through ``wandb`` (the ``wandb`` extra), imported when a writer is made
(``Run(writers=["wandb"])``)."""

from __future__ import annotations

import pathlib
import threading
from typing import Any, Mapping

from hostcall._apps.metrics import keys, registry
from hostcall._apps.metrics.block import Block
from hostcall._apps.metrics.writer import Writer


#: The history columns W&B fills itself.
_WANDB_COLUMNS = ("_step", "_runtime", "_timestamp")


def _tree(values: dict, names: list, nested: dict) -> dict:
  """A step's ``{key: value}`` (``keys.steps``) as W&B's ``log`` takes a
  nested dict: the keys of each metric of ``nested`` (``name``,
  ``name/member_0``, ...) under its path's dicts."""
  out: dict = {}
  for key, value in values.items():
    name = max((n for n in names if key == n or key.startswith(n + "/")),
               key=len, default=None)
    path = nested.get(name)
    if path is None:
      out[key] = value
      continue
    node = out
    for label in path[:-1]:
      node = node.setdefault(label, {})
    node[path[-1] + key[len(name):]] = value
  return out


class WandbWriter(Writer):
  """The rows of a run as the history of one Weights & Biases run (the
  ``wandb`` extra): ``wandb.init`` with the user's settings, one
  ``run.log(..., step=step)`` per step, ``run.finish()`` when the hostcall
  run closes.

  What ``Run(writers=["wandb"])`` makes, with the hostcall run's name as
  the W&B run's name and its ``params`` as the run's config; W&B's own
  environment (``WANDB_PROJECT``, ``WANDB_MODE=offline``, ``WANDB_DIR``,
  ..., read by W&B once a process, at its first ``wandb.init``) says the
  rest; ``init`` arguments say it per run. Keys as ``MlflowWriter``'s: a vmap member's value is
  ``<name>/member_<k>``, an array metric one key per element. W&B keeps
  steps increasing: log each step once, in order (rows of a step lower
  than one logged before are dropped by W&B, with its warning). A text
  value is a value of the history; a nested dict's leaves (``train.loss``)
  are handed to W&B as the nested dict, as ``wandb.log`` of it would be;
  the run's config is the W&B run's config, updated at each change.

  Offline (``WANDB_MODE=offline``) the run is written to
  ``<WANDB_DIR>/wandb/offline-run-*/run-*.wandb``; ``wandb sync`` uploads
  it, and ``wandb leet inspect --json <file>`` prints its records (the
  history rows as ``{"type": "history", ...}``) without a server.

  Arguments:
    **init: ``wandb.init``'s arguments (``project``, ``mode``, ``name``,
      ``config``, ``settings``, ...). ``reinit`` defaults to
      ``"create_new"``, so that several hostcall runs (and the user's own
      W&B run) each have their own W&B run.

  Attributes:
    run: the W&B run.

  Raises:
    ImportError: ``wandb`` is not installed (``pip install
      'hostcall[wandb]'``).

  Example:
    >>> import numpy as np, os, tempfile, hostcall
    >>> os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true",
    ...                   WANDB_DIR=tempfile.mkdtemp())
    >>> writer = hostcall.metrics.WandbWriter(project="doc", name="fit")
    >>> writer.write(hostcall.metrics.Block(
    ...     step=np.array([0, 1]), metrics={"loss": np.array([1.0, 0.5])}))
    >>> writer.close()
    >>> writer.run.name
    'fit'
  """

  def __init__(self, **init):
    wandb = registry.import_extra("wandb", "wandb")
    init.setdefault("reinit", "create_new")
    self.run = wandb.init(**init)
    self._closed = False
    self._paths: dict[str, tuple] = {}  # name: its keys (see _keep_paths)
    self._paths_lock = threading.Lock()

  def __repr__(self):
    return f"WandbWriter({self.run.name!r})"

  def check_metrics(self, shapes: dict[str, tuple],
                    paths: dict[str, tuple] | None = None) -> None:
    """Refuses, when ``Run.log`` is traced, the empty name, the names of
    W&B's own history columns (``_step``, ``_runtime``, ``_timestamp``),
    an array metric beside a metric named as one of its elements'
    keys (``w`` and ``w/0``), and names W&B could not hold as nested
    keys (see ``_keep_paths``).

    Arguments:
      shapes: ``{name: shape}`` of the call's metrics.
      paths: the keys of each of them that was a nested dict's leaf
        (``{"train.loss": ("train", "loss")}``).

    Raises:
      ValueError: naming the metric and why.
    """
    for name in shapes:
      if name == "":
        raise ValueError(
            "the W&B writer refuses the metric name '': W&B keeps no "
            "metric without a name in its history (its readers skip it), "
            "so its values would be lost. Name it, e.g. 'value'.")
      if name in _WANDB_COLUMNS and shapes[name] == ():
        raise ValueError(
            f"the W&B writer refuses the metric name {name!r}: W&B fills "
            f"the history column {name!r} itself ({', '.join(_WANDB_COLUMNS)}"
            f"), and would mix the two. Rename it, e.g. {name[1:]!r}.")
    keys.check_collisions(shapes, "W&B")
    self._keep_paths(shapes, paths or {})

  def _keep_paths(self, shapes: dict, paths: dict) -> None:
    """Keeps the keys of each name that was a nested dict's leaf, so that
    W&B is handed the tree again (as ``wandb.log`` of the dict would: its
    ``define_metric("train.loss")`` and its summary see a nested key);
    refuses a name W&B would hold both as a nested key and as a flat one,
    or both as a value and as a dict of values."""
    with self._paths_lock:
      kept = dict(self._paths)
      for name in shapes:
        path = paths.get(name, (name,))
        if kept.setdefault(name, path) != path:
          raise ValueError(
              f"the W&B writer refuses the metric {name!r}: the run logs it "
              "both as a nested dict's key and as a flat name, which W&B "
              "keeps as two metrics. Log it one way.")
      nodes = {path[:i] for path in kept.values() for i in range(1, len(path))}
      both = sorted(".".join(p) for p in set(kept.values()) & nodes)
      if both:
        raise ValueError(
            f"the W&B writer refuses the metric {both[0]!r}: W&B holds the "
            f"values of a nested dict under the key {both[0]!r}, which the "
            "run also logs as a value of its own. Rename one of them.")
      self._paths = kept

  def check_config(self, changes: dict[str, Any]) -> None:
    """Refuses a config key W&B would rename (it strips leading and
    trailing ``-``: ``"--lr"`` would be ``lr``) or keeps for itself
    (``_wandb``).

    Raises:
      ValueError: naming the key and why.
    """
    for key in changes:
      if key == "_wandb":
        why, fix = "keeps it for its own settings", "wandb_"
      elif key.strip("-") != key:
        why, fix = "strips a key's leading and trailing '-'", (
            key.strip("-") or "key")
      else:
        continue
      raise ValueError(
          f"the W&B writer refuses the config key {key!r}: W&B {why}, so "
          f"the key would not be {key!r} there. Rename it, e.g. {fix!r}.")

  def write_config(self, config: dict[str, Any]) -> None:
    """Updates the W&B run's config with the keys whose value it does not
    hold (``run.config.update``, values allowed to change)."""
    held = self.run.config
    changed = {k: v for k, v in config.items()
               if k not in held or held[k] != v}
    if changed:
      self.run.config.update(changed, allow_val_change=True)

  def write(self, block: Block) -> None:
    """Logs the rows of ``block``: one ``run.log`` per step, with every
    key of that step's rows.

    Arguments:
      block: the rows to log.
    """
    nested = {n: self._paths[n] for n in block.metrics
              if len(self._paths.get(n, ())) > 1}
    for step, values in keys.steps(block):
      self.run.log(_tree(values, list(block.metrics), nested) if nested
                   else values, step=step)

  def close(self) -> None:
    """Finishes the W&B run (once)."""
    if not self._closed:
      self._closed = True
      self.run.finish()


def for_run(run_dir: pathlib.Path, name: str | None = None,
            params: Mapping[str, Any] | None = None) -> WandbWriter:
  """The writer of ``Run(writers=["wandb"])``: a W&B run named as the
  hostcall run, with ``params`` as its config."""
  return WandbWriter(name=name or run_dir.name, config=dict(params or {}))
