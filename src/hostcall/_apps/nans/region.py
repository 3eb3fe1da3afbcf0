"""The checks of one stretch of a checked program: what runs once each time
the stretch is entered (the program, a loop's body for one step, a
``cond``'s branch).

A region keeps its checks' codes in the order they ran and gives the first
that found something (``found.first_of``). Each check is numbered in the
trace's ``Sites`` when traced. The clock (how many checks ran before one)
is a traced value only where a loop or a branch made it one: a check's
time is the region's clock when it was last traced plus a count known
when traced.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from hostcall._apps.nans import found as found_
from hostcall._apps.nans.sites import Site, Sites


class Place(NamedTuple):
  """Where an equation sits, as its checks report it: the pass, the user's
  line of the nearest equation that has one (the equations of a function
  JAX defines, such as ``jnp.where``'s, have none of their own), the loops
  around it."""

  phase: str
  where: str | None = None
  loops: tuple[str, ...] = ()

  def inside(self, loop: str) -> "Place":
    return self._replace(loops=(*self.loops, loop))


class Region:
  """The checks of one stretch, ``depth`` loops deep at most."""

  def __init__(self, sites: Sites, infs: bool, depth: int, clock=0):
    self.sites, self.infs, self.depth = sites, infs, depth
    self._entries: list[found_.Found] = []
    self._clock = clock  # a traced value once a loop or branch ran
    self._count = 0      # checks traced since

  def now(self):
    """The clock: how many checks ran before the next one."""
    if isinstance(self._clock, int):
      return jnp.int32(self._clock + self._count)
    return self._clock + jnp.int32(self._count)

  def check(self, value, site: Site) -> None:
    """Checks ``value`` (skipped where it cannot hold a NaN: integers,
    booleans, empty arrays), reported as ``site``."""
    if not found_.can_hold_nan(value):
      return
    code = found_.code_of(value, self.infs)
    number = self.sites.add(site)
    self._entries.append(found_.Found(
        code, jnp.int32(number), self.now(),
        jnp.full((self.depth,), -1, jnp.int32)))
    self._count += 1

  def add(self, found: found_.Found, clock) -> None:
    """What a nested stretch found (a loop, a branch), and the clock after
    it."""
    self._entries.append(found_.pad(found, self.depth))
    self._clock, self._count = clock, 0

  def found(self) -> found_.Found:
    """The first of the region's checks that found something."""
    return found_.first_of(self._entries, self.depth)
