"""``Listener``: what follows the loops' invocations (a progress bar, a
steered loop's host side), the one channel through which it hears of
them from the registry (``invocations.Invocations.listen``)."""

from __future__ import annotations


class Listener:
  """What follows the invocations: the one channel through which a
  listener hears of them. The ``on_`` methods are called under the
  registry's lock, in the order the events happen, ``on_opened``,
  ``on_ticked`` and ``on_finish`` outside it; the default ignores each.
  An ``invocation`` is the registry's ``invocations.Invocation``."""

  def on_open(self, invocation) -> None:
    """A device opened ``invocation`` (raising refuses the open)."""

  def on_opened(self, invocation) -> None:
    """After every listener's ``on_open``, once ``invocation`` is
    registered, outside the lock (a steered loop's host side opens its
    stop state here, from ``invocation.stop``; raising fails the open's
    call, the invocation staying open)."""

  def on_tick(self, invocation, count: int, lanes: int | None,
              running: int | None, values: tuple | None = None) -> None:
    """``invocation`` has run ``count`` steps (``lanes``: its vmap lanes;
    ``running``: those still running a while_loop; ``values``: what its
    body set, ``((key, text or array over the lanes), ...)``, or None)."""

  def on_ticked(self, handle: int, count: int, device) -> None:
    """After every listener's ``on_tick`` of this tick of ``handle`` on
    ``device`` (also where one raised, or the invocation has ended),
    outside the lock: a steered loop's predicate runs here, and its check,
    waiting for it, may answer."""

  def follows_every_tick(self, spec, handle: int) -> bool:
    """Whether the listener must see each tick of the invocation
    ``handle`` of a site whose spec is ``spec``, not only the last of a run
    of them that the queue hands over at once (asked also where the
    invocation has ended)."""
    del spec, handle
    return False

  def on_finish(self, handle: int, reason: int) -> None:
    """A steered loop stopped on a device, for ``reason`` (its invocation
    may have ended already: a global view's devices finish after its one
    device closed it); raising fails the loop's computation there (a
    failure its host side contained)."""

  def on_end(self, invocation, count: int | None,
             lanes: int | None, stopped: bool, force: bool) -> None:
    """``invocation`` ended on its device: by its close after ``count``
    steps, or (``count`` None) ended without one (a counter at its total, a
    failed computation, a barrier). ``stopped``: it stopped early;
    ``force``: a barrier ends it, no other device will join it."""

  def on_release(self, group: tuple[int, int]) -> None:
    """Every device of the invocation ``group`` has ended (or never will)."""

  def on_stale(self, opened_before: float) -> None:
    """A barrier: every invocation opened before ``opened_before`` that no
    device runs now (each has ended, or never will open it) is over."""
