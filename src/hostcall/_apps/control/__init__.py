"""Steering compiled loops from the host: stop at the next check, keep the
state so far.

A steered loop (``hostcall.progress.scan`` / ``fori_loop`` / ``while_loop``
with ``interruptible=``, ``time_limit=`` or ``stop_when=``, or
``hostcall.control.while_loop``) runs in chunks of steps, as the progress
loops do, and after each chunk asks "stop now?" (``check``). The answer
comes from host state in about a microsecond (``states.StopStates``: the
stop check's own native library, read by its FFI handler
``hostcall_control_check``, or by a Python callback where the emission
table gives the platform no handler), so
the device waits for no Python: the host sets that state when Ctrl-C
arrives, when the time limit passes (checked against the clock), or when a
predicate run after each chunk's tick says so. The loop then skips what is
left and returns its state with how many steps it ran and why it stopped.

Every device running one invocation stops after the same check (see
``hostcall_control.cc``); under ``vmap`` every lane stops with the others.

Ctrl-C: hostcall's SIGINT handler is installed while an interruptible loop
runs, and the one it replaced is put back as soon as none does. A loop stops
running when its computation goes past it (the loop's finish, a
synchronous call each device makes after the loop, under ``hostcall.jit``
the device's own, ``finish_here``: not its bar's close, which waits
behind the loop's asynchronous taps) or fails: where the computation runs in a Python thread
(JAX runs one with host callbacks in the thread that called it, on CPU),
the frame that called it is watched, and its return ends the loops the
computation opened (``interrupts.Reaper``); elsewhere a failed loop ends at the next
barrier, which closes its bar.
"""

from hostcall._apps.control.check import check, finish_here
from hostcall._apps.control.host import controls
from hostcall._apps.control.spec import (FAILED, INTERRUPTED, STOP_WHEN,
                                         TIME_LIMIT, LoopStatus, Result, Stop,
                                         reason_name)
from hostcall._apps.loops import steerer as _steerer

__all__ = ["FAILED", "INTERRUPTED", "STOP_WHEN", "TIME_LIMIT", "LoopStatus",
           "Result", "Stop", "check", "controls", "finish_here",
           "reason_name"]

# The engine's loops are steered by this package (the engine imports no
# application).
_steerer.provide(_steerer.Steerer(stop_of=Stop.of, check=check,
                                   finish_here=finish_here, result=Result))
