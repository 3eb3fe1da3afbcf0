"""``hostcall.control.plateau``: a ``stop_when`` predicate for early
stopping, over a metric a ``hostcall.metrics.Run`` logs."""

from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np

from hostcall._apps.control.spec import LoopStatus


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
