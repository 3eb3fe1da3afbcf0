"""Delivering a batch whose calls of several call sites alternate.

A program that makes several queued calls (``hostcall.jit``'s: a print and
a callback in one step) queues them site after site, so that a batch of
its calls is a run of one call a site, over and over. Delivered run by
run, each call paid for what a run costs (its site looked up, its bytes
decoded, its host function's call set up): several times what the same
call costs in a run of its own site's calls. Here each site's calls are
read at once (one decode a site and batch: ``native_queue.Interleaved``),
what each site's delivery needs is set up once, and the calls are then
delivered in queue order, run by run, as before: program order, each
failing alone, postponed to the barrier.
"""

from __future__ import annotations

import itertools

import numpy as np

from hostcall import _jax_private
from hostcall._core import context as _context
from hostcall._core.context import calling
from hostcall._core.targets import Steps
from hostcall._runtime import call_sites, calls, errors
from hostcall._runtime.call_sites import sites


def deliver(batch, consumer, bypassed) -> None:
  """Delivers every call of ``batch`` (a ``native_queue.Interleaved`` whose
  sites are all joinable) in queue order; after each run where
  ``consumer._bypassing``, ``bypassed()``. A site that cannot be read
  fails each of its runs alone, postponed. A site's delivery that keeps
  something until every call is delivered (a metrics run's rows) has
  ``finish()`` called then, whatever failed."""
  prepared = {site: _prepare(site, packed)
              for site, packed in batch.by_site().items()}
  try:
    _deliver(prepared, batch, consumer, bypassed)
  finally:
    _finish(prepared.values())


def _finish(prepared) -> None:
  """Each delivery's ``finish()``, where it has one, in the asynchronous
  delivery's context; a failure postponed."""
  finishing = [one for one in prepared if hasattr(one, "finish")]
  if not finishing:
    return
  with calling(None, True):
    for one in finishing:
      try:
        one.finish()
      except BaseException as exc:  # noqa: BLE001 - the consumer never dies
        errors.postpone(exc, f"delivering queued calls of site {one.site}")


def _deliver(prepared: dict, batch, consumer, bypassed) -> None:
  run_sites, counts = batch.order()
  batch.clear()
  runs = zip([prepared[site] for site in run_sites], counts)
  # Asynchronous delivery for the whole batch; each run's context is
  # set (calling() a run would cost more than a small call).
  with calling(None, True):
    for one, count in runs:
      try:
        one.deliver(count)
      except BaseException as exc:  # noqa: BLE001 - the consumer never dies
        errors.postpone(exc, f"delivering a queued call of site {one.site}")
      if consumer._bypassing:
        bypassed()


def _prepare(site: int, packed):
  """What delivers ``packed``'s calls (one site's, in queue order) a run at
  a time: the site's reading, or the failure to read it."""
  try:
    target, context, layouts = sites.get(site)
    columns = call_sites.read_columns(target, layouts, packed)
    if target.deliver_steps is not None and target.joins_calls:
      # (A target may join the batch's calls itself: a metrics run's rows.)
      rows = getattr(target, "interleaved_rows", None)
      joined = None if rows is None else rows(site, context, columns)
      return (joined if joined is not None
              else _Steps(site, target, context, columns))
    writer = target.lines_writer(context)
    if writer is not None:
      lines = _lines(writer, columns)
      if lines is not None:
        return _Lines(site, target, context, writer, *lines)
    return _Each(site, target, context, columns, packed.count)
  except BaseException as exc:  # noqa: BLE001 - its runs fail, postponed
    return _Failed(site, exc)


def _lines(writer, columns):
  """``(lines, lines a call)`` of the site's calls written at once, or None
  where ``lines_of`` cannot say or its lines do not split evenly (each
  call's text has as many: numbers are written without a line's end)."""
  try:
    text = writer.lines_of(columns)
  except Exception:  # noqa: BLE001 - each call then runs, failing in its words
    return None
  if text is None or not columns:
    return None
  lines, calls_n = text.splitlines(keepends=True), len(columns[0])
  if not calls_n or len(lines) % calls_n or "".join(lines) != text:
    return None
  return lines, len(lines) // calls_n


class _Failed:
  """A site whose calls could not be read: each run raises its failure."""

  def __init__(self, site: int, exc: BaseException):
    self.site, self.exc, self.traceback = site, exc, exc.__traceback__

  def deliver(self, count: int) -> None:
    del count
    # (Each run's report shows where reading failed, once.)
    raise self.exc.with_traceback(self.traceback)



class _Steps:
  """A vectorised target that joins calls (a metrics row): a run's calls
  in one ``deliver_steps``, as a run of its own would be."""

  def __init__(self, site, target, context, columns):
    self.site, self.target, self.context, self.at = site, target, context, 0
    rank = len(context.batch_levels)
    self.columns = [np.moveaxis(c, 0, rank) if rank else c for c in columns]
    self.rank = rank

  def deliver(self, count: int) -> None:
    at, rank = self.at, self.rank
    self.at = at + count
    pick = (slice(None),) * rank + (slice(at, at + count),)
    calls.run(Steps(self.target, count), [c[pick] for c in self.columns],
              self.context, asynchronous=True)



class _Lines:
  """A print: each call's lines formatted with the site's others, each
  run's written at once."""

  def __init__(self, site, target, context, writer, lines, per_call):
    self.site, self.target, self.context = site, target, context
    # (On this thread, a delivery thread: without the look at which.)
    self.write = getattr(writer, "write_delivered", writer.write_lines)
    self.per_call = per_call
    self.lines, self.tally = iter(lines), context._tally

  def deliver(self, count: int) -> None:
    n = count * self.per_call
    text = (next(self.lines) if n == 1
            else "".join(itertools.islice(self.lines, n)))
    if self.tally is not None:  # each a run of its program
      self.tally.add(count)
    _thread.context = self.context
    try:
      self.write(text)
    except BaseException as exc:  # noqa: BLE001 - a tap must never kill the run
      calls.failed(self.target, exc, self.context)



class _Each:
  """Any other target: each call in turn (as ``calls.each``), its
  arguments views of the site's columns."""

  def __init__(self, site, target, context, columns, n: int):
    self.site, self.target, self.context = site, target, context
    self.call, self.tally = target.caller(context), context._tally
    at = call_sites.indices(n)
    self.single = len(columns) == 1
    if self.single:  # (the common call: no tuple a call)
      flats = map(columns[0].__getitem__, at)
    elif columns:
      flats = zip(*[map(c.__getitem__, at) for c in columns])
    else:
      flats = [()] * n
    flats = list(flats)
    placed = _placed_first(self.call, flats, self.single, columns)
    if placed is not None:
      (self.call, flats), self.single = placed, False
    self.flats = iter(flats)

  def deliver(self, count: int) -> None:
    if self.tally is not None:  # each a run of its program
      self.tally.add(count)
    _thread.context = self.context
    if count == 1:
      # (The common run of an interleaved batch: one call, no loop.)
      try:
        if self.single:
          self.call(next(self.flats))
        else:
          self.call(*next(self.flats))
      except BaseException as exc:  # noqa: BLE001 - a tap must never kill the run
        calls.failed(self.target, exc, self.context)
      return
    calls.each(self.target, self.call, itertools.islice(self.flats, count),
               self.context, self.single)




def _placed_first(call, flats: list, single: bool, columns: list):
  """``(call, arguments)`` where ``call`` is a ``jax.debug.callback``'s,
  which places its values before it calls (``placement_of``), and the
  site's values are small: every call's values placed at once, in one
  loop, each call's a tuple, and ``call`` the call with them. One
  placement after another costs far less than one between other sites'
  calls. None where the host function is another, the values are large
  (each is then placed at its call, as a run of its own places it) or a
  placement fails (each call then fails at its own)."""
  parts = _jax_private.placement_of(call)
  if parts is None or sum(c.nbytes for c in columns) > _PLACED_FIRST:
    return None
  places, call_with = parts
  try:
    if single:
      placed = list(map(places, flats))
    else:
      placed = [places(*values) for values in flats]
  except Exception:  # noqa: BLE001 - each call fails in its own words
    return None
  return call_with, placed


#: The most bytes of a site's values in a batch placed at once.
_PLACED_FIRST = 1 << 20


#: This thread's call context, set for each run (``swap_call_context``
#: without its look at the one before: ``deliver`` restores that once).
_thread = _context._current

# Host functions are called from these (see ``calls.is_host_function_entry``).
calls.calls_host_functions(_Lines.deliver, _Each.deliver)
