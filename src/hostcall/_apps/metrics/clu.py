"""``CluWriter``: a run's rows handed to a CLU ``MetricWriter`` (or any
object with its ``write_scalars`` / ``flush`` / ``close``); CLU itself is
never imported."""

from __future__ import annotations

from hostcall._apps.metrics import config as _config, keys
from hostcall._apps.metrics.block import Block
from hostcall._apps.metrics.writer import Writer


def is_clu_writer(value) -> bool:
  """Whether ``value`` has CLU's ``MetricWriter`` interface (a callable
  ``write_scalars``) and is not a hostcall ``Writer``."""
  return (not isinstance(value, Writer)
          and callable(getattr(value, "write_scalars", None)))


class CluWriter(Writer):
  """Hands a run's rows to a CLU ``clu.metric_writers.MetricWriter``, or
  any object with its ``write_scalars(step, scalars)``, ``flush()`` and
  ``close()``.

  ``Run(writers=[clu_writer])`` wraps such an object in a ``CluWriter``
  itself. Each step of a block is one ``write_scalars(step, {key:
  value})``, with keys as ``MlflowWriter``'s (a vmap member's value is
  ``<name>/member_<k>``, an array metric one key per element); a step's
  text values are one ``write_texts(step, {key: text})`` (refused, when
  ``Run.log`` is traced, where the object has no ``write_texts``); the
  run's config is ``write_hparams(config)``, nested keys joined by ``.``
  (where the object has it); ``flush`` and ``close`` are passed on (where
  the object has them).

  Arguments:
    writer: the CLU writer.

  Attributes:
    writer: that writer.

  Example:
    >>> import jax, hostcall
    >>> class Scalars:  # CLU's MetricWriter interface, the part used here
    ...   def __init__(self):
    ...     self.seen = []
    ...   def write_scalars(self, step, scalars):
    ...     self.seen.append((step, dict(scalars)))
    ...   def flush(self): pass
    ...   def close(self): pass
    >>> scalars = Scalars()
    >>> run = hostcall.metrics.Run("doc-clu", writers=[scalars])
    >>> _ = jax.jit(jax.vmap(lambda x: run.log(3, loss=x)))(jax.numpy.ones(2))
    >>> run.close()
    >>> scalars.seen
    [(3, {'loss/member_0': 1.0, 'loss/member_1': 1.0})]
  """

  def __init__(self, writer):
    if not is_clu_writer(writer):
      raise TypeError(
          f"CluWriter takes an object with CLU's MetricWriter interface "
          f"(write_scalars(step, scalars), flush(), close()), got "
          f"{writer!r} of type {type(writer).__name__}.")
    self.writer = writer

  def __repr__(self):
    return f"CluWriter({self.writer!r})"

  def check_metrics(self, shapes: dict[str, tuple]) -> None:
    """Refuses, when ``Run.log`` is traced, an array metric beside a
    metric named as one of its elements' keys (``w`` and ``w/0``).

    Arguments:
      shapes: ``{name: shape}`` of the call's metrics.
    """
    keys.check_collisions(shapes, "CLU")

  def check_texts(self, texts: dict[str, str]) -> None:
    """Refuses text values where the CLU writer has no ``write_texts``.

    Raises:
      ValueError: naming the texts and why.
    """
    if not callable(getattr(self.writer, "write_texts", None)):
      raise ValueError(
          f"the CLU writer {self.writer!r} refuses the text value(s) "
          f"{sorted(texts)}: it has no write_texts(step, texts), and "
          "write_scalars takes numbers only. Log them without it, or give "
          "it a write_texts (CLU's MetricWriter has one).")

  def write_config(self, config: dict) -> None:
    """Hands the run's config to the CLU writer's ``write_hparams`` (where
    it has one), nested keys joined by ``.``."""
    write_hparams = getattr(self.writer, "write_hparams", None)
    if callable(write_hparams):
      write_hparams(_config.flat(config))

  def write(self, block: Block) -> None:
    """Calls ``write_scalars`` once per step of ``block`` (and
    ``write_texts`` for the step's text values).

    Arguments:
      block: the rows to write.
    """
    for step, values in keys.steps(block):
      texts = {k: v for k, v in values.items() if isinstance(v, str)}
      scalars = {k: v for k, v in values.items() if k not in texts}
      if scalars:
        self.writer.write_scalars(step, scalars)
      if texts:
        self.writer.write_texts(step, texts)

  def flush(self) -> None:
    """The CLU writer's ``flush()``, where it has one."""
    flush = getattr(self.writer, "flush", None)
    if flush is not None:
      flush()

  def close(self) -> None:
    """The CLU writer's ``close()`` (which flushes), where it has one;
    else ``flush()``."""
    close = getattr(self.writer, "close", None)
    if close is not None:
      close()
    else:
      self.flush()
