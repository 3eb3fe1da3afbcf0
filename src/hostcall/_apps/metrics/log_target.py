"""``LogTarget``: the host side of one ``Run.log`` call site, which turns
the values a tap delivers into a ``Block`` (one row per step and vmap
member, with the device that logged it) and puts it on the run's sink."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np

from hostcall._apps.metrics.block import Block
from hostcall._apps.metrics.interleaved_rows import SiteRows
from hostcall._apps.metrics.sink import RunSink
from hostcall._core import PostponingTarget, target as _target
from hostcall._core.targets import Schedule


@_target
class LogTarget(PostponingTarget):
  """The host side of one ``Run.log`` call site."""

  sink: RunSink = dataclasses.field(compare=False)
  run_id: int
  names: tuple
  has_step: bool
  #: Made by a call outside ``jit``: its deliveries are counted out of
  #: the sink's calls in flight (``users.Users``).
  eager: bool = False
  #: The call's text values, ``((name, text), ...)``: known when it was
  #: traced, they never reach the device; each row has them.
  texts: tuple = ()
  #: Every metric's name, in the order given (``names`` and the texts').
  order: tuple = ()

  schedule = Schedule(delivery="async")  # the device never waits for writers
  remat = "once"  # a rematerialised step must not log its rows twice

  def __repr__(self):
    return f"metrics.Run({self.sink.name!r}).log{self.names}"

  def deliver(self, flat_args, context):
    try:
      self._add(flat_args, context, steps=None)
    finally:
      if self.eager:
        self.sink.users.eager_calls(-1)
    return ()

  joins_calls = True  # each row stands alone

  def deliver_steps(self, stacked, steps, context):
    try:
      self._add(stacked, context, steps=steps)
    finally:  # (consecutive calls outside jit are delivered together)
      if self.eager:
        self.sink.users.eager_calls(-steps)

  def _add(self, args, context, steps: int | None) -> None:
    sink = self.sink.current()
    batch_rank = len(context.batch_levels) if context else 0
    lanes = math.prod(np.shape(args[0])[:batch_rank]) if args else 1
    rows = lanes * (steps or 1)

    def rows_first(a):
      a = np.asarray(a)
      if steps is not None and batch_rank:  # (*batch, K, ...) -> (K, ...)
        a = np.moveaxis(a, batch_rank, 0)
      return a.reshape(rows, *a.shape[batch_rank + (steps is not None):])

    columns = [rows_first(a) for a in args]
    if self.has_step:
      step, *values = columns
      step = step.astype(np.int64)
    else:
      values = columns
      step = np.repeat(sink.take_steps(steps or 1), lanes)
    member = (np.tile(np.arange(lanes), steps or 1) if batch_rank else None)
    block = self.rows_block(step, values, context, member)
    if rows:
      sink.note_latest(int(step[-1]), {name: v[-1] for name, v in
                                       block.metrics.items()})
    sink.put(block)

  def rows_block(self, step: np.ndarray, values: list, context,
                 member: np.ndarray | None = None) -> Block:
    """The block of rows at ``step`` of this site's ``values`` (one
    column a metric it logs on the device, rows first), its text values
    and index columns added."""
    sink, rows = self.sink.current(), len(step)
    device = _device_column(context, rows)
    process = (None if sink.process is None
               else np.full(rows, sink.process, dtype=np.int64))
    metrics = dict(zip(self.names, values))
    if self.texts:
      texts = {name: np.full(rows, text) for name, text in self.texts}
      metrics = {name: metrics[name] if name in metrics else texts[name]
                 for name in self.order}
    return Block(step, metrics, member, device, process)

  def interleaved_rows(self, site: int, context, columns: list):
    """How the calls of this site in a batch where they alternate with
    other sites' are delivered (``_runtime/interleaved.py``): their rows
    put once the batch is delivered (``SiteRows``); None under ``vmap``
    (each run then a ``deliver_steps``)."""
    if context is None or context.batch_levels:
      return None
    return SiteRows(site, self, context, columns)

def _device_column(context, rows: int) -> np.ndarray | None:
  device = getattr(context, "device", None)
  if device is None or _single_device():
    return None
  return np.full(rows, device.id)


@functools.cache
def _single_device() -> bool:
  return jax.device_count() == 1
