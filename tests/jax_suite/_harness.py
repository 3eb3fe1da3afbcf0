"""Differential harness: one program, run with JAX's callbacks and with
hostcall's, in the same process; what each run produced is compared.

A *program* is ``program(cb, log)``: ``cb`` is a :class:`Flavour` (the four
callbacks of one implementation), ``log`` a list its host functions append
to (through :func:`norm`, so a CPU ``jax.Array`` and a NumPy array holding
the same values record the same). Whatever the program returns is blocked
on, turned into NumPy and compared; so are its printed text, its host log,
the exception it raised and what it logged at ERROR level.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import io
import logging
from typing import Any, Callable

import jax
import numpy as np
from jax._src import dispatch as _dispatch
from jax.experimental import io_callback as _jax_io_callback

import hostcall


@dataclasses.dataclass(frozen=True)
class Flavour:
  name: str
  pure: Callable
  io: Callable
  debug: Callable
  print: Callable

  def kind(self, kind: str) -> Callable:
    """The callback of JAX's ``with_pure_and_io_callbacks`` parameter."""
    if kind == "pure":
      return self.pure
    if kind == "io_ordered":
      return functools.partial(self.io, ordered=True)
    if kind == "io_unordered":
      return functools.partial(self.io, ordered=False)
    raise ValueError(kind)


JAX = Flavour("jax", jax.pure_callback, _jax_io_callback, jax.debug.callback,
              jax.debug.print)
HOSTCALL = Flavour("hostcall", hostcall.pure_callback, hostcall.io_callback,
                   hostcall.debug_callback, hostcall.debug_print)
FLAVOURS = (JAX, HOSTCALL)
KINDS = ("io_unordered", "io_ordered", "pure")


@dataclasses.dataclass(frozen=True)
class Arr:
  """An array as recorded: dtype, shape and values (compared by repr, so
  NaNs compare equal and -0.0 differs from 0.0)."""
  dtype: str
  shape: tuple
  values: str

  def __repr__(self):
    return f"{self.dtype}{list(self.shape)}={self.values}"


def norm(tree: Any) -> Any:
  """A comparable record of what a host function received or returned."""
  def leaf(v):
    if isinstance(v, (jax.Array, np.ndarray, np.generic)):
      a = np.asarray(v)
      return Arr(a.dtype.name, a.shape, repr(a.tolist()))
    return v
  return jax.tree_util.tree_map(leaf, tree)


@dataclasses.dataclass
class Outcome:
  flavour: str
  value: Any = None
  error: BaseException | None = None
  printed: str = ""
  calls: list = dataclasses.field(default_factory=list)
  logged: list = dataclasses.field(default_factory=list)

  @property
  def error_text(self) -> str:
    if self.error is None:
      return ""
    text = str(self.error)
    if len(text) > 600:  # a runtime error carries the whole stack
      text = text[:150] + " [...] " + text[-400:]
    return f"{type(self.error).__name__}: {text}"

  def __repr__(self):
    return (f"Outcome({self.flavour}: value={self.value!r}, "
            f"error={self.error_text[:300]!r}, printed={self.printed!r}, "
            f"calls={self.calls!r})")


class _ErrorRecords(logging.Handler):

  def __init__(self):
    super().__init__(level=logging.ERROR)
    self.records = []

  def emit(self, record):
    text = record.getMessage()
    if record.exc_info:
      text += "\nTraceback (most recent call last)"
    self.records.append(text)


def _barrier():
  jax.effects_barrier()
  hostcall.barrier()


def run(flavour: Flavour, program: Callable) -> Outcome:
  outcome = Outcome(flavour.name)
  out = io.StringIO()
  handler = _ErrorRecords()
  root = logging.getLogger()
  root.addHandler(handler)
  try:
    with contextlib.redirect_stdout(out):
      try:
        value = program(flavour, outcome.calls)
        value = jax.block_until_ready(value)
        _barrier()
        outcome.value = norm(value)
      except Exception as exc:  # noqa: BLE001 - the outcome is compared
        outcome.error = exc
        with contextlib.suppress(Exception):
          _barrier()
        # A failed computation's runtime token would fail every later
        # effects barrier; JAX's own tests clear them after each test.
        _dispatch.runtime_tokens.clear()
  finally:
    root.removeHandler(handler)
  outcome.printed = out.getvalue()
  outcome.logged = handler.records
  return outcome


def both(program: Callable) -> tuple[Outcome, Outcome]:
  return run(JAX, program), run(HOSTCALL, program)


def _multiset(xs):
  return collections.Counter(repr(x) for x in xs)


def same(program: Callable, *, ordered: bool = True, words: tuple = (),
         error: type | None = None, lines_ordered: bool | None = None,
         check_logged: bool = False) -> tuple[Outcome, Outcome]:
  """Runs ``program`` with both flavours and asserts the same outcome.

  ordered: host calls compared in order (else as a multiset).
  lines_ordered: printed lines compared in order (default: ``ordered``).
  error: the exception type both must raise (``None``: both must succeed).
  words: what both error messages must contain.
  """
  j, h = both(program)
  if lines_ordered is None:
    lines_ordered = ordered
  if error is None:
    assert j.error is None, f"JAX raised: {j.error_text}"
    assert h.error is None, f"hostcall raised: {h.error_text}\nJAX: {j!r}"
  else:
    assert isinstance(j.error, error), f"JAX: {j.error_text or j.value!r}"
    assert isinstance(h.error, error), (
        f"hostcall: {h.error_text or repr(h.value)}\nJAX: {j.error_text}")
  for w in words:
    assert w in str(j.error), f"JAX's message lacks {w!r}: {j.error_text}"
    assert w in str(h.error), (
        f"hostcall's message lacks {w!r}: {h.error_text}\nJAX: {j.error_text}")
  assert_same_tree(j.value, h.value)
  if ordered:
    assert h.calls == j.calls, f"host calls differ:\nJAX:      {j.calls}\nhostcall: {h.calls}"
  else:
    assert _multiset(h.calls) == _multiset(j.calls), (
        f"host calls differ:\nJAX:      {j.calls}\nhostcall: {h.calls}")
  if lines_ordered:
    assert h.printed == j.printed, (
        f"printed text differs:\nJAX:\n{j.printed}\nhostcall:\n{h.printed}")
  else:
    assert (collections.Counter(h.printed.splitlines())
            == collections.Counter(j.printed.splitlines())), (
        f"printed lines differ:\nJAX:\n{j.printed}\nhostcall:\n{h.printed}")
  if check_logged:
    assert bool(h.logged) == bool(j.logged), (j.logged, h.logged)
  return j, h


def assert_same_tree(a, b):
  assert a == b, f"results differ:\nJAX:      {a!r}\nhostcall: {b!r}"
