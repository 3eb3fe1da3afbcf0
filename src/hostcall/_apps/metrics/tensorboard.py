"""``TensorBoardWriter``: TensorBoard event files through ``tensorboardX``,
the ``tensorboard`` extra, imported when a writer is made
(``Run(writers=["tensorboard"])`` writes ``<run>/tensorboard/``)."""

from __future__ import annotations

import os
import pathlib

import numpy as np

from hostcall._apps.metrics import registry
from hostcall._apps.metrics.block import Block, python_values
from hostcall._apps.metrics.keys import key_of
from hostcall._apps.metrics.writer import Writer


class TensorBoardWriter(Writer):
  """TensorBoard event files through ``tensorboardX`` (the ``tensorboard``
  extra): scalars as scalars, arrays as histograms; a vmap member's values
  under ``<name>/member_<k>``.

  What ``Run(writers=["tensorboard"])`` writes to
  ``<root>/<name>/tensorboard/`` (``tensorboard --logdir runs`` shows every
  run). Where rows carry a process or a device, its values go under
  ``<name>/process_<p>``, ``<name>/device_<id>`` (then ``/member_<k>``).
  Any metric name is taken as a tag.

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
    self.logdir = pathlib.Path(logdir)
    self._writer = SummaryWriter(logdir=str(self.logdir))

  def write(self, block: Block) -> None:
    """Adds a scalar (scalar metrics) or a histogram (array metrics) per
    row and metric, at the row's step.

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
    """Flushes and closes the event file."""
    self._writer.close()


def for_run(run_dir: pathlib.Path) -> TensorBoardWriter:
  """The writer of ``Run(writers=["tensorboard"])``:
  ``<run_dir>/tensorboard/``."""
  return TensorBoardWriter(run_dir / "tensorboard")
