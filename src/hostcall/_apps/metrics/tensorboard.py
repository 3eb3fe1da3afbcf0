"""``TensorBoardWriter``: TensorBoard event files through ``tensorboardX``,
the ``tensorboard`` extra, imported when a writer is made
(``Run(writers=["tensorboard"])`` writes ``<run>/tensorboard/``)."""

from __future__ import annotations

import os
import pathlib
import re
import threading

import numpy as np

from hostcall._apps.metrics import config as _config, registry
from hostcall._apps.metrics.block import Block, is_text, python_values
from hostcall._apps.metrics.keys import key_of
from hostcall._apps.metrics.writer import Writer

# tensorboardX's rule for a tag (its summary._clean_tag): what is not a
# letter, digit, '_', '-', '.' or '/' becomes '_', leading '/'s are cut.
_NOT_IN_A_TAG = re.compile(r"[^-/\w.]")

#: What tensorboardX adds to a text's tag (its text summary's).
TEXT_SUFFIX = "/text_summary"


def tag_of(name: str) -> str:
  """The tag tensorboardX writes a scalar or histogram named ``name``
  under.

  Example:
    >>> from hostcall._apps.metrics.tensorboard import tag_of
    >>> tag_of("a b"), tag_of("a?b"), tag_of("/loss"), tag_of("train.loss")
    ('a_b', 'a_b', 'loss', 'train.loss')
  """
  return _NOT_IN_A_TAG.sub("_", name).lstrip("/")


def _hparam(value):
  """A flat config value as TensorBoard's hparams take it (a number, a
  bool or text; lists as JSON text)."""
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  return _config.as_text(value)


class TensorBoardWriter(Writer):
  """TensorBoard event files through ``tensorboardX`` (the ``tensorboard``
  extra): scalars as scalars, arrays as histograms; a vmap member's values
  under ``<name>/member_<k>``.

  What ``Run(writers=["tensorboard"])`` writes to
  ``<root>/<name>/tensorboard/`` (``tensorboard --logdir runs`` shows every
  run). Where rows carry a process or a device, its values go under
  ``<name>/process_<p>``, ``<name>/device_<id>`` (then ``/member_<k>``).
  A text value is a text summary (``add_text``, TensorBoard's Text tab),
  tagged ``<name>/text_summary``. The run's config is TensorBoard's
  hparams (its HParams tab), nested keys joined by ``.``, written when
  the run closes (TensorBoard takes a tag's hparams from its first event
  only: the config's last values are written once).

  tensorboardX rewrites a tag's characters other than letters, digits,
  ``_ - . /`` to ``_`` (``"a b"`` is ``a_b``): a name whose tag another
  name of the run already has (``"a b"`` beside ``"a_b"``), and the empty
  name, are refused when ``Run.log`` is traced, since the two would be one
  curve.

  Arguments:
    logdir: the directory of the event files.

  Attributes:
    logdir: that directory, as a ``pathlib.Path``.

  Raises:
    ImportError: ``tensorboardX`` is not installed (``pip install
      'hostcall[tensorboard]'``).

  Example:
    >>> import numpy as np, hostcall
    >>> writer = hostcall.metrics.TensorBoardWriter("runs/doc-tb/tensorboard")
    >>> writer.write(hostcall.metrics.Block(
    ...     step=np.array([0, 1]), metrics={"loss": np.array([1.0, 0.5])}))
    >>> writer.close()
    >>> any(p.name.startswith("events.") for p in writer.logdir.iterdir())
    True
  """

  def __init__(self, logdir: str | os.PathLike):
    SummaryWriter = registry.import_extra("tensorboard",
                                          "tensorboardX").SummaryWriter
    self._hparams = registry.import_extra("tensorboard",
                                          "tensorboardX.summary").hparams
    self.logdir = pathlib.Path(logdir)
    self._writer = SummaryWriter(logdir=str(self.logdir))
    self._tags: dict[str, tuple] = {}  # tag: (name, kind) that has it
    self._tags_lock = threading.Lock()
    self._config: dict = {}  # written as hparams at close

  def __repr__(self):
    return f"TensorBoardWriter({str(self.logdir)!r})"

  def check_metrics(self, shapes: dict[str, tuple],
                    texts: dict[str, str] | None = None) -> None:
    """Refuses, when ``Run.log`` is traced, a name whose tag (as
    tensorboardX rewrites it) another name of this writer has, and a name
    whose tag would be empty.

    Arguments:
      shapes: ``{name: shape}`` of the call's metrics (its texts' names
        among them).
      texts: the call's text values by name: their tag is
        ``<name>/text_summary``, which tensorboardX does not rewrite.

    Raises:
      ValueError: naming both names, the tag and the rule.
    """
    texts = texts or {}
    tags = {(name, "metric name"): tag_of(name) for name in shapes
            if name not in texts}
    tags.update({(name, "text"): name + TEXT_SUFFIX for name in texts})
    self._claim(tags)

  def _claim(self, tags: dict[tuple, str]) -> None:
    """Keeps each ``(name, kind): tag``, refusing a tag that another
    name has (or an empty one) before keeping any."""
    with self._tags_lock:
      taken = dict(self._tags)
      for (name, kind), tag in tags.items():
        if not tag:
          raise ValueError(
              f"the TensorBoard writer refuses the {kind} {name!r}: its tag "
              "would be empty (tensorboardX cuts leading '/'s), and "
              "TensorBoard shows no such curve. Rename it.")
        other = taken.setdefault(tag, (name, kind))
        if other != (name, kind):
          raise ValueError(
              f"the TensorBoard writer refuses the {kind} {name!r}: "
              f"tensorboardX writes it as the tag {tag!r}, which the "
              f"{other[1]} {other[0]!r} already has (tensorboardX turns "
              "characters other than letters, digits, '_', '-', '.' and "
              "'/' into '_'), so their values would be one curve. Rename "
              f"one of them, e.g. {tag + '_2'!r}.")
      self._tags = taken

  def write_config(self, config: dict) -> None:
    """Keeps the run's config, written as TensorBoard's hparams (its
    HParams tab) when the writer closes: TensorBoard reads a tag's
    metadata, where hparams are, from its first event only, so a config
    written earlier could not change."""
    self._config = dict(config)

  def _write_hparams(self, config: dict) -> None:
    """Writes ``config`` as hparams: nested keys joined by ``.``, lists
    as JSON text."""
    hparams = {k: _hparam(v) for k, v in _config.flat(config).items()}
    file_writer = self._writer._get_file_writer()
    for summary in self._hparams(hparams, {}):
      file_writer.add_summary(summary)

  def write(self, block: Block) -> None:
    """Adds a scalar (scalar metrics), a histogram (array metrics) or a
    text (text values) per row and metric, at the row's step.

    Arguments:
      block: the rows to write.
    """
    steps = block.step.tolist()
    members = (block.member.tolist() if block.member is not None
               else [None] * len(steps))
    devices = (block.device.tolist() if block.device is not None
               else [None] * len(steps))
    processes = (block.process.tolist() if block.process is not None
                 else [None] * len(steps))
    for name, values in block.metrics.items():
      scalar = values.ndim == 1
      if is_text(values):
        for row, (step, member, device, process) in enumerate(
            zip(steps, members, devices, processes)):
          self._writer.add_text(key_of(name, process, device, member),
                                str(values[row]), step)
        continue
      values = np.asarray(python_values(values), dtype=np.float64)
      for row, (step, member, device, process) in enumerate(
          zip(steps, members, devices, processes)):
        tag = key_of(name, process, device, member)
        if scalar:
          self._writer.add_scalar(tag, float(values[row]), step)
        else:
          self._writer.add_histogram(tag, values[row], step)

  def flush(self) -> None:
    """Writes the pending events to the event file."""
    self._writer.flush()

  def close(self) -> None:
    """Writes the run's config as hparams (where it has one), then flushes
    and closes the event file."""
    if self._config:
      config, self._config = self._config, {}  # (once)
      self._write_hparams(config)
    self._writer.close()


def for_run(run_dir: pathlib.Path) -> TensorBoardWriter:
  """The writer of ``Run(writers=["tensorboard"])``:
  ``<run_dir>/tensorboard/``."""
  return TensorBoardWriter(run_dir / "tensorboard")
