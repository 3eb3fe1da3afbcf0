"""A hint, once a process, that a ``jax.jit`` program with host calls is
called from a Python loop, where ``hostcall.jit`` would dispatch it
without leaving JAX's fast path.

Any JAX effect (any callback) sends a compiled call off JAX's C++ dispatch
path: a small jitted step with one host call, called from a Python loop
under ``jax.jit``, costs many times the plain step, and little more under
``hostcall.jit`` (docs/performance.md, the cost cliff). This tells the
user who pays it, and only them:

* ``lowering`` gives a ``Tally`` to a call site that runs once per run of
  its program (no loop's lowering encloses it), whose call ``hostcall.jit``
  takes out of the program's effects (a deferrable target), in a program
  ``jax.jit`` compiled: not one ``hostcall.jit`` compiled (its calls carry
  no effect, or it kept the program as it is and said why), not a call
  outside ``jit``, not one call a device. Its ``Program`` remembers a call
  of the same program that ``hostcall.jit`` would leave in place (a
  callback whose result the program reads): that program is not fast
  under ``hostcall.jit`` either, and gets no hint.
* Each delivery of such a site is one run of its program: the runtime's
  callback counts a synchronous one (``lowering``), the run path a queued
  one (``calls``). The count costs an addition where it is kept; a site
  without a tally costs nothing more.
* Every ``CHECK`` runs the tally reads the clock: ``CHECK`` runs in less
  than ``CHECK * SPACING`` seconds are a Python loop over a small step,
  whose dispatch is then much of its cost. The hint is a
  ``SlowDispatchWarning`` at the user's line that first called the
  program, given once a process, then no tally reads the clock again.

``HOSTCALL_HINTS=0``, read when a program is compiled, gives no site a
tally; a ``warnings`` filter on ``SlowDispatchWarning`` silences the hint.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
import weakref

from hostcall import _jax_private
from hostcall._runtime import eager

#: Runs between two readings of the clock.
CHECK = 100
#: The longest mean time between two runs that is a loop's over a small
#: step, in seconds: where the dispatch off the fast path is much of a
#: step's cost (docs/performance.md, the cost cliff, has the figures).
SPACING = 1e-3

_NEVER = float("inf")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep
_JIT_DIR = _PACKAGE_DIR + "_jit" + os.sep


class SlowDispatchWarning(UserWarning):
  """A ``jax.jit`` program with host calls was called many times from a
  Python loop, each call off JAX's fast dispatch path; ``hostcall.jit``
  in place of ``jax.jit`` would keep it there.

  Given once a process, at the line that first called the program.
  ``HOSTCALL_HINTS=0`` or
  ``warnings.filterwarnings("ignore", category=hostcall.SlowDispatchWarning)``
  silences it.
  """


class Program:
  """What the tallied sites of one compiled program share: where the user
  first called it, and whether ``hostcall.jit`` would leave one of its
  calls in place (``kept``: then it would not be fast either)."""

  __slots__ = ("where", "kept", "module")

  def __init__(self, module, where):
    # (A weak reference: a program's module is not kept once lowered.)
    self.module, self.where, self.kept = weakref.ref(module), where, False


class Tally:
  """The runs of one call site's program, counted (see the module's
  docstring)."""

  __slots__ = ("program", "label", "count", "check_at", "since", "counted")

  def __init__(self, program: Program, label: str):
    self.program, self.label = program, label
    # The first run starts the clock: compiling is not a step.
    self.count, self.check_at, self.since, self.counted = 0, 1, None, 0

  def add(self, runs: int = 1) -> None:
    """Counts ``runs`` runs of the program (deliveries of the site)."""
    self.count += runs
    if self.count >= self.check_at:
      self._check()

  def _check(self) -> None:
    now = time.monotonic()
    runs, since = self.count - self.counted, self.since
    if _given or self.program.kept:
      self.check_at = _NEVER
      return
    self.since, self.counted, self.check_at = now, self.count, \
        self.count + CHECK
    if since is not None and now - since < runs * SPACING:
      self.check_at = _NEVER
      _give(self, runs, now - since)


_given = False  # the hint was given (once a process)
_lock = threading.Lock()
_lowering = threading.local()  # the program being lowered in this thread


def enabled() -> bool:
  """Whether programs compiled now may hint (``HOSTCALL_HINTS`` is not
  ``0``) and none has yet."""
  return not _given and os.environ.get("HOSTCALL_HINTS", "1") != "0"


def tally_for(ctx, target, *, answers: bool, per_device: bool
              ) -> Tally | None:
  """The tally of a call site being lowered (``ctx``), or None where it
  may not hint (see the module's docstring). ``answers``: the program
  reads the call's results; ``per_device``: each device makes the call
  (``shard_map``, a partitioned call)."""
  if not enabled():
    return None
  program = _program_of(ctx)
  if program is None:
    return None
  # As hostcall.jit's deferring judges a call it would take out.
  taken = target.schedule.live_without_effect or (target.queueable and (
      not answers or target.schedule.answer is not None))
  if not taken or per_device:  # (one a device: not judged, no hint)
    program.kept = True  # hostcall.jit would keep this program as it is
  if answers or per_device or not target.deferrable or _in_a_loop():
    return None
  return Tally(program, target.label)


def _program_of(ctx) -> Program | None:
  """The ``Program`` of the module ``ctx`` lowers (one for all its
  sites), or None where it is not ``jax.jit``'s (``hostcall.jit``'s, a
  call outside ``jit``) or no user's line called it."""
  module = ctx.module_context.module
  program = getattr(_lowering, "program", None)
  if program is not None and program.module() is module:
    return program if program.where is not None else None
  where = _first_caller()
  _lowering.program = Program(module, where)
  return _lowering.program if where is not None else None


def _first_caller():
  """``(file, line, module name, globals)`` of the user's line that is
  compiling the program, or None where ``hostcall.jit`` or a call outside
  ``jit`` compiles it (or no user's line is on the stack)."""
  frame = sys._getframe(2)
  while frame is not None:
    code = frame.f_code
    if code.co_filename.startswith(_JIT_DIR) or eager.is_eager_call(frame):
      return None
    if not (code.co_filename.startswith(_PACKAGE_DIR)
            or _jax_private.is_jax_frame(frame)):
      return (code.co_filename, frame.f_lineno,
              frame.f_globals.get("__name__", ""), frame.f_globals)
    frame = frame.f_back
  return None


def _in_a_loop() -> bool:
  """Whether the site being lowered sits in a loop's body or condition."""
  frame = sys._getframe(2)
  while frame is not None:
    if _jax_private.is_loop_lowering_frame(frame):
      return True
    frame = frame.f_back
  return False


def _give(tally: Tally, runs: int, seconds: float) -> None:
  """Gives the hint for ``tally``'s program, once a process."""
  global _given
  with _lock:
    if _given:
      return
    _given = True
  filename, line, module, module_globals = tally.program.where
  message = (
      f"the jax.jit program called here ran {runs} times in "
      f"{seconds * 1e3:.0f} ms ({seconds / runs * 1e6:.0f} us a call) from a "
      f"Python loop. Its host call ({tally.label}) gives it a JAX effect, "
      "which sends every call off JAX's fast dispatch path: a small step "
      "then costs several to tens of times its plain cost. hostcall.jit, "
      "with jax.jit's arguments, compiles such calls without an effect: "
      "write @hostcall.jit where this function is jitted "
      "(docs/performance.md: 'A Python loop over a jitted step'). Said once "
      "a process; HOSTCALL_HINTS=0 or warnings.filterwarnings('ignore', "
      "category=hostcall.SlowDispatchWarning) silences it.")
  try:
    warnings.warn_explicit(message, SlowDispatchWarning, filename, line,
                           module=module, module_globals=module_globals)
  except Exception:  # noqa: BLE001 - a hint never fails a host call
    # A filter makes it an error, which a delivery must not raise: said
    # on hostcall's logger instead.
    logging.getLogger("hostcall").warning("%s:%d: %s: %s", filename, line,
                                          SlowDispatchWarning.__name__,
                                          message)
