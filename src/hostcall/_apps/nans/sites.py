"""The host side of ``find_nans``: what each check looks at, the report a
found NaN becomes, and what is done with it.

Each check a trace adds is a ``Site`` (the primitive and the user's line,
or the input it looks at; the loops around it), numbered in the trace's
``Sites``; the device sends a site's number, never a text. The ``Reporter``
is the host function of the one asynchronous call a checked pass makes when
it found something: it turns the numbers into a ``NanReport`` and leaves a
``FloatingPointError`` for the next barrier, warns or hands it on, as
``find_nans(on_nan=...)`` says.
"""

from __future__ import annotations

import dataclasses
import linecache
import threading
import warnings
from typing import Callable

import numpy as np

from hostcall._apps.nans.found import NAN
from hostcall._runtime import errors

ON_NAN = ("raise", "warn")


@dataclasses.dataclass(frozen=True)
class Site:
  """One check: an equation's output, or an input.

  Attributes:
    phase: ``"forward"`` or ``"backward"``.
    primitive: the JAX primitive whose output is checked (None for an
      input).
    input: for an input, which one (``"x"``, ``"params['w']"``, ``"a value
      f closes over"``, ``"the cotangent of output 0"``).
    where: ``file:line`` of the user's code that made the equation, where
      known.
    loops: the loops around the check, outermost first (``"scan"``,
      ``"while_loop"``).
  """

  phase: str
  primitive: str | None = None
  input: str | None = None
  where: str | None = None
  loops: tuple[str, ...] = ()


class Sites:
  """The checks of one trace, by number. Read by the ``Reporter`` on a
  delivery thread while a backward pass may still add its own."""

  def __init__(self):
    self._sites: list[Site] = []
    self._lock = threading.Lock()

  def add(self, site: Site) -> int:
    with self._lock:
      self._sites.append(site)
      return len(self._sites) - 1

  def __getitem__(self, number: int) -> Site:
    with self._lock:
      return self._sites[number]

  def __len__(self) -> int:
    with self._lock:
      return len(self._sites)


@dataclasses.dataclass(frozen=True)
class NanReport:
  """The first value a checked call found holding a NaN or an infinity.

  Attributes:
    function: the checked function's name.
    phase: ``"forward"`` (the function itself) or ``"backward"`` (its
      backward pass, under ``jax.grad``/``jax.vjp``).
    value: ``"NaN"`` or ``"infinity"``.
    primitive: the JAX primitive whose output held it (``"log"``,
      ``"mul"``), or None where an input already held it.
    input: which input held it (``"x"``, ``"the cotangent of output
      0"``), or None.
    where: ``file:line`` of the user's code that made the operation (in
      the backward pass: the forward line whose derivative it computes),
      or None where unknown.
    steps: ``(loop, step)`` for each loop around the operation, outermost
      first, e.g. ``(("scan", 3), ("while_loop", 0))``. In the backward
      pass, the step of the forward loop whose derivative it computes.
    member: the ``vmap`` member's index at each ``vmap`` level, outermost
      first; ``()`` outside ``vmap``.
    members: how many ``vmap`` members found one (1 outside ``vmap``).
  """

  function: str
  phase: str
  value: str
  primitive: str | None
  input: str | None
  where: str | None
  steps: tuple[tuple[str, int], ...] = ()
  member: tuple[int, ...] = ()
  members: int = 1

  @property
  def source(self) -> str | None:
    """The text of the line ``where`` names, where it can be read."""
    if not self.where:
      return None
    path, _, line = self.where.rpartition(":")
    text = linecache.getline(path, int(line)) if line.isdigit() else ""
    return text.strip() or None

  def __str__(self) -> str:
    value = "a NaN" if self.value == "NaN" else "an infinity"
    what = (f"{self.primitive} made {value}" if self.primitive is not None
            else f"{self.input} holds {value}" if self.phase == "backward"
            else f"input {self.input} holds {value}")
    text = f"find_nans: {self.function}, {self.phase} pass: {what}"
    if self.where:
      text += f" at {self.where}"
    where = [f"{loop} step {step}" for loop, step in self.steps]
    if self.member:
      index = ", ".join(map(str, self.member))
      where.append(f"vmap member {index}" + (
          f" (one of {self.members} members that found one)"
          if self.members > 1 else ""))
    if where:
      text += f" ({'; '.join(where)})"
    source = self.source
    return text + (f"\n    {source}" if source else "")


@dataclasses.dataclass(frozen=True, eq=False)
class Reporter:
  """The host function of a checked pass's report: the device's numbers
  made a ``NanReport`` and handled as ``on_nan`` says."""

  sites: Sites
  function: str
  on_nan: str | Callable

  @property
  def __name__(self) -> str:  # noqa: PLW3201 - how hostcall names the call
    return f"find_nans({self.function})"

  def __call__(self, code, site, steps, member, members) -> None:
    report = self.report(code, site, steps, member, members)
    if self.on_nan == "raise":
      # Postponed to the next barrier as a failing asynchronous call is,
      # without the delivery's frames: the report says where it was made.
      error = FloatingPointError(str(report))
      error.report = report
      errors.postpone(error, self.__name__)
      return
    if self.on_nan == "warn":
      warnings.warn(str(report), RuntimeWarning, stacklevel=1)
    else:
      self.on_nan(report)

  def report(self, code, site, steps, member, members) -> NanReport:
    """The report of what the device sent (NumPy values)."""
    found = self.sites[int(site)]
    steps = [int(s) for s in np.asarray(steps)[:len(found.loops)]]
    return NanReport(
        function=self.function, phase=found.phase,
        value="NaN" if int(code) == NAN else "infinity",
        primitive=found.primitive, input=found.input, where=found.where,
        steps=tuple(zip(found.loops, steps)),
        member=tuple(int(m) for m in np.asarray(member)),
        members=max(int(members), 1))


def check_on_nan(on_nan) -> None:
  if on_nan in ON_NAN or (callable(on_nan) and not isinstance(on_nan, str)):
    return
  raise ValueError(
      f"find_nans: on_nan must be one of {ON_NAN} or a function taking the "
      f"report, got {on_nan!r}; e.g. hostcall.find_nans(f, on_nan='warn') or "
      "on_nan=reports.append.")
