"""``Writer``: the interface of a metrics writer (the built-in ones and
anyone's own subclass).

A writer receives ``Block``s on the writer thread (``writer_thread.py``),
never on the thread that delivers callbacks, so a slow disk does not slow
the device. A named writer (``Run(writers=["jsonl"])``) is found through
``registry.py``.
"""

from __future__ import annotations

from typing import Any

from hostcall._apps.metrics.block import Block


class Writer:
  """The interface of a metrics writer; subclass it for a new format.

  A ``hostcall.metrics.Run`` given an instance (``Run(name,
  writers=[MyWriter(...)])``) calls its ``write`` with every block of rows
  logged, on the run's writer thread (shared by every run of the process,
  never the thread that delivers callbacks), in the order the blocks were
  logged; ``write_config`` with the run's config when the run opens (where
  it has one) and when it changes; ``flush`` at every ``hostcall.barrier()``
  and ``Run.flush()``;
  ``close`` once, when the run closes (``Run.close()``, a new run of the
  same directory, or interpreter exit). Only ``write`` must be defined.

  An exception raised by any of them is logged and raised by the next
  ``hostcall.barrier()`` as ``hostcall.CallbackException``; the run's
  other writers still receive every row.

  Example:
    >>> import jax, hostcall
    >>> class Collect(hostcall.metrics.Writer):
    ...   def __init__(self):
    ...     self.rows = []
    ...   def write(self, block):
    ...     self.rows.extend(block.records())
    >>> collect = Collect()
    >>> run = hostcall.metrics.Run("doc-writer", writers=[collect])
    >>> _ = jax.jit(lambda x: run.log(7, loss=x))(0.5)
    >>> run.close()
    >>> collect.rows
    [{'step': 7, 'loss': 0.5}]
  """

  def write(self, block: Block) -> None:
    """Writes a block of rows.

    Called on the run's writer thread, once per block, blocks in the order
    they were logged. It may take its time: the device and the delivery of
    other callbacks do not wait for it.

    Arguments:
      block: the rows (see ``Block``); its arrays are the writer's to keep.

    Raises:
      NotImplementedError: in this base class; subclasses define it.
    """
    raise NotImplementedError

  def check_metrics(self, shapes: dict[str, tuple]) -> None:
    """Refuses metrics this writer could not keep, when a ``Run.log`` call
    is traced (never on the writer thread, where a refusal would lose
    rows). The base class takes every metric.

    Arguments:
      shapes: the call's metrics: ``{name: shape}`` (a scalar's shape is
        ``()``; under ``vmap``, a member's; a text value's ``()``). A
        subclass whose ``check_metrics`` takes ``texts=`` is given the
        call's text values by name too.

    Raises:
      ValueError: a name (or a name beside another) the writer refuses,
        saying which writer, which name and why.
    """
    del shapes

  def check_texts(self, texts: dict[str, str]) -> None:
    """Refuses text values this writer could not keep, when a ``Run.log``
    call with text values (``run.log({"phase": "train"})``) is traced;
    their names are also among ``check_metrics``' shapes, as scalars. The
    base class takes every text (a ``write`` then finds a column of
    NumPy text, dtype ``str``, in ``block.metrics``).

    Arguments:
      texts: the call's text values by name.

    Raises:
      ValueError: a text the writer refuses, saying which writer and why.
    """
    del texts

  def check_config(self, changes: dict[str, Any]) -> None:
    """Refuses a change of the run's config this writer could not keep
    (``run.config.update``, or ``Run(params=...)`` when the run opens),
    before anything changes. The base class takes every change.

    Arguments:
      changes: the keys that change (or are new) and their values (JSON
        values: numbers, bools, text, None, lists and dicts of them).

    Raises:
      ValueError: naming the writer, the key and why.
    """
    del changes

  def write_config(self, config: dict[str, Any]) -> None:
    """Keeps the run's config: called with the whole config when the run
    opens (where it has one) and after each change, in order with the
    blocks (on the writer thread once the run is open). The base class
    keeps nothing.

    Arguments:
      config: the run's config, every key (JSON values; nested dicts for
        nested keys).
    """
    del config

  def flush(self) -> None:
    """Makes every row written so far reach its destination (a file's
    buffer to the disk, say).

    Called by ``hostcall.barrier()``, ``Run.flush()`` and before ``close``,
    from the thread that asked, once every block logged before has gone
    through ``write``. The base class does nothing.
    """
    pass

  def close(self) -> None:
    """Releases what the writer holds (files, handles); called once, when
    its run closes, after a last ``flush``. No ``write`` or ``flush``
    follows.

    The base class calls ``flush()``.
    """
    self.flush()
