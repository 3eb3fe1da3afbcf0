"""``hostcall.control``'s loops and predicates: a steered loop that no bar
draws (a chunked loop, ``chunked.py``, whose site's spec is
``loops.Undrawn``) and the stop checks' predicates."""

from __future__ import annotations

import math
import numbers
from typing import Any, Callable

import numpy as np

from hostcall._apps import chunked as _chunked, loops as _loops, \
    scan as _scan
from hostcall._apps.control import LoopStatus, Stop
from hostcall._core.checks import check_callable


def while_loop(cond_fun: Callable, body_fun: Callable, init_val, *,
               every: int | None = None, interruptible: bool = False,
               time_limit: float | None = None,
               stop_when: Callable | None = None) -> Any:
  """``jax.lax.while_loop`` that the host can stop, without a progress bar.

  Arguments:
    cond_fun, body_fun, init_val: as for ``jax.lax.while_loop``.
    every: steps between two checks; default None lets the host pace them
      (about ten a second, whatever a step costs).
    interruptible: the first Ctrl-C (a notebook's interrupt) stops the loop
      at its next check and the call returns normally; a second one raises
      ``KeyboardInterrupt`` as usual.
    time_limit: seconds after which the loop stops at its next check.
    stop_when: a host predicate of a ``LoopStatus``, called after each
      chunk; True stops the loop at a following check.

  Returns:
    A ``hostcall.control.Result``: the carry when the loop ended or
    stopped, whether it stopped early, after how many steps, and why.

  Example:
    >>> import jax, hostcall
    >>> out = jax.jit(lambda: hostcall.control.while_loop(
    ...     lambda c: c < 10**9, lambda c: c + 1, 0, every=1000,
    ...     stop_when=lambda status: status.steps >= 5000))()
    >>> bool(out.stopped), hostcall.control.reason_name(out.reason)
    (True, 'stop_when')
    >>> int(out.steps) == int(out.value) and 5000 <= int(out.steps) <= 7000
    True
  """
  if interruptible is False and time_limit is None and stop_when is None:
    raise TypeError("hostcall.control.while_loop needs a reason to stop: "
                    "interruptible=True, time_limit= or stop_when=; without "
                    "one, use jax.lax.while_loop.")
  check_callable(cond_fun, "the while loop's cond_fun")
  check_callable(body_fun, "the while loop's body_fun")
  if every is not None:
    _scan.check_every(every, ", or None for the default")
  stop = Stop.of(interruptible, time_limit, stop_when)
  # No bar: its site's spec is Undrawn, which no drawing listener draws;
  # it ticks only for its predicate.
  site = _loops.invocations.site(_loops.Undrawn(_chunked.depth(),
                                                stop.interruptible))
  return _chunked.while_loop(site, stop, stop.stop_when is not None,
                             cond_fun, body_fun, init_val, -1, every)


def plateau(run, name: str, *, patience: int = 10, min_delta: float = 0.0,
            mode: str = "min") -> Callable[[LoopStatus], bool]:
  """A ``stop_when`` predicate: stop once metric ``name`` of ``run`` has not
  improved for ``patience`` checks (early stopping).

  Arguments:
    run: the ``hostcall.metrics.Run`` the loop logs ``name`` to.
    name: the metric to watch (its last logged value at each check).
    patience: checks without improvement before stopping.
    min_delta: how much better than the best so far counts as better.
    mode: ``"min"`` (lower is better, a loss) or ``"max"`` (an accuracy).

  Returns:
    A predicate for ``stop_when=``.

  Example:
    >>> import jax, jax.numpy as jnp, hostcall
    >>> run = hostcall.metrics.Run("doc-plateau", writers=["memory"])
    >>> def step(c, _):
    ...   run.log(c, loss=jnp.maximum(10.0 - c, 3.0))   # stalls at step 7
    ...   return c + 1, None
    >>> out = jax.jit(lambda: hostcall.progress.scan(
    ...     step, 0, length=10_000, every=10, disable=True,
    ...     stop_when=hostcall.control.plateau(run, "loss", patience=3)))()
    >>> bool(out.stopped), int(out.steps) < 10_000
    (True, True)
  """
  if not (callable(getattr(run, "latest", None))
          and callable(getattr(run, "flush", None))):
    raise TypeError(
        f"plateau watches a metric of a hostcall.metrics.Run, got {run!r} of "
        f"type {type(run).__name__}: pass the run the loop logs to, e.g. "
        "plateau(run, 'loss') with run = hostcall.metrics.Run('fit').")
  if not isinstance(name, str):
    raise TypeError(f"plateau's name is the metric's name (a str, as given "
                    f"to run.log), got {name!r} of type "
                    f"{type(name).__name__}.")
  if (isinstance(min_delta, (bool, np.bool_))
      or not isinstance(min_delta, numbers.Real)
      or not 0 <= float(min_delta) < math.inf):
    raise ValueError(f"min_delta is a finite number >= 0 (how much better "
                     f"than the best so far counts as better), got "
                     f"{min_delta!r}.")
  if mode not in ("min", "max"):
    raise ValueError(f"mode is 'min' or 'max', got {mode!r}")
  if not isinstance(patience, int) or isinstance(patience, bool) or \
      patience < 1:
    raise ValueError(f"patience is a number of checks >= 1 (a Python int), "
                     f"got {patience!r}")
  sign = 1.0 if mode == "min" else -1.0
  state = {"best": math.inf, "seen": None, "waited": 0}

  def stop_when(status: LoopStatus) -> bool:
    del status
    latest = run.latest(name)
    if latest is None or latest[0] == state["seen"]:
      return False  # nothing new logged since the last check
    state["seen"] = latest[0]
    value = sign * float(latest[1])
    if value < state["best"] - min_delta:
      state["best"], state["waited"] = value, 0
    else:
      state["waited"] += 1
    return state["waited"] >= patience

  return stop_when
