"""Steering compiled loops from the host: stop a running loop and keep what
it has done so far.

    out = hostcall.progress.scan(step, init, xs, interruptible=True,
                                 time_limit=3600, stop_when=hostcall.control.plateau(run, "loss"))
    (carry, ys), stopped, steps, reason = out   # a hostcall.control.Result

The progress loops (``hostcall.progress.scan`` / ``fori_loop`` /
``while_loop``) take ``interruptible=``, ``time_limit=`` and
``stop_when=``; ``hostcall.control.while_loop`` is a steered
``lax.while_loop`` without a bar.
"""

from hostcall._apps.control import (INTERRUPTED, STOP_WHEN, TIME_LIMIT,
                                    LoopStatus, Result, reason_name)
from hostcall._apps.control.plateau import plateau
from hostcall._apps.control.while_loop import while_loop

__all__ = ["INTERRUPTED", "LoopStatus", "Result", "STOP_WHEN", "TIME_LIMIT",
           "plateau", "reason_name", "while_loop"]
