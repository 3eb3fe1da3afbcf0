"""Which Python frame waits for a computation that still runs.

On the CPU a program runs on the thread that called it: while it runs,
the frame that called it stays on that thread's stack. A barrier in one
thread ends the loops that computations started before it left open
(theirs failed); it must not end another thread's loop whose computation
still runs. Such a loop is known by the frame waiting for its computation:
one found below a live host call (``frame_waiting_for_the_computation``),
or, for a loop whose open was queued, any frame of ``hostcall.jit``'s
dispatch (``add_dispatch_code``) on its thread's stack.
"""

from __future__ import annotations

import sys

from hostcall import _jax_private
from hostcall._runtime.eager import is_eager_call

_dispatch_codes: set = set()


def add_dispatch_code(code) -> None:
  """``code`` is that of a function through which a thread waits for a
  computation it dispatched (``hostcall.jit``'s wrapper)."""
  _dispatch_codes.add(code)


def frame_waiting_for_the_computation():
  """The frame of the calling thread that waits for the computation running
  this host function (it returns when the computation ends, whether it
  finished or failed), or None: where the runtime runs it in a thread of
  its own, with no Python frame below the callback, or where the call is a
  computation of its own (outside ``jit``)."""
  frame = sys._getframe(1)
  while frame is not None and not _jax_private.is_callback_frame(frame):
    frame = frame.f_back
  while frame is not None and _jax_private.is_callback_frame(frame):
    frame = frame.f_back
  caller = frame
  while caller is not None and _jax_private.is_jax_frame(caller):
    caller = caller.f_back
  if caller is not None and is_eager_call(caller):
    return None
  return frame


def on_stack(top, frame) -> bool:
  """Whether ``frame`` is on the stack whose top frame is ``top``."""
  while top is not None:
    if top is frame:
      return True
    top = top.f_back
  return False


def dispatching(top) -> bool:
  """Whether the stack whose top frame is ``top`` waits in ``hostcall.jit``'s
  dispatch (a computation it called may still run)."""
  while top is not None:
    if top.f_code in _dispatch_codes:
      return True
    top = top.f_back
  return False
