"""Where a delivered call prints: ``sys.stdout`` as it was when its
program was dispatched.

A call that ``hostcall.jit`` queues or defers reaches the host after its
program returns, when the caller may have put ``sys.stdout`` back
(``contextlib.redirect_stdout``, pytest's ``capsys``). Its print belongs
where it would have gone at the call, as ``jax.jit``'s would. So a
dispatch notes ``sys.stdout`` (``noted``: one comparison while it stays the
same); where it changed, the calls dispatched before are delivered first,
to the stream of their own dispatch, and the new one is where the next
ones print (``stream``, read by hostcall's printers on the delivery
threads). A barrier, once everything is delivered, forgets it.
"""

from __future__ import annotations

import sys

from hostcall._runtime import tap_queue
from hostcall._runtime.outputs_replay import deferred
from hostcall._core.context import why_waiting_is_forbidden

#: ``sys.stdout`` at the last dispatch (a list: read without a global
#: lookup on the dispatch path); None: nothing dispatched since a barrier.
NOTED: list = [None]


def noted() -> None:
  """Notes ``sys.stdout`` for the program about to be dispatched (what
  ``hostcall.jit`` does before each, inline: ``if sys.stdout is not
  NOTED[0]``)."""
  if sys.stdout is not NOTED[0]:
    changed()


def changed() -> None:
  """``sys.stdout`` is not what the last dispatch noted: the calls
  dispatched before are delivered to theirs, then it is noted."""
  if NOTED[0] is not None and why_waiting_is_forbidden() is None:
    tap_queue.wait()
  NOTED[0] = sys.stdout


def stream():
  """The stream a print of the call being delivered writes to: on a
  delivery thread, ``sys.stdout`` as its program's dispatch noted it;
  elsewhere (a call the program waits for) ``sys.stdout``."""
  if NOTED[0] is not None and (tap_queue.consumer.is_consumer
                                or deferred.is_deliverer):
    return delivered_stream()
  return sys.stdout


def delivered_stream():
  """``stream()`` on a delivery thread (the caller knows it is one): the
  noted stream, unless it was closed since."""
  noted_stream = NOTED[0]
  if noted_stream is not None and not getattr(noted_stream, "closed", False):
    return noted_stream
  return sys.stdout


def forget() -> None:
  """After a barrier delivered everything: the next dispatch notes again."""
  NOTED[0] = None
