"""Jupyter and IPython: each cell's host output lands in that cell, complete.

A jitted function returns before its asynchronous taps, progress bars and
metric rows have reached the host; in a notebook, what the delivery thread
prints after the cell has finished would appear under the next cell (or,
for a bar's last redraw, be lost). Imported inside IPython, hostcall
registers a ``post_run_cell`` hook that waits, at the end of every cell,
until what the cell's computations sent to the host has been delivered,
rows written and bars closed. Tap errors stay pending for the next
``hostcall.barrier()``, as outside notebooks.
"""

from __future__ import annotations

import logging
import sys

from hostcall._runtime.barriers import wait_without_raising

logger = logging.getLogger("hostcall")


def _end_of_cell(*_) -> None:
  try:
    wait_without_raising()
  except Exception:  # noqa: BLE001 - a hook must never break the notebook
    logger.exception("hostcall: waiting for the cell's host calls failed")


def install(shell=None) -> bool:
  """Registers the end-of-cell wait with ``shell`` (default: the running
  IPython, if any); returns whether a hook was installed."""
  if shell is None:
    ipython = sys.modules.get("IPython")  # never import IPython ourselves
    shell = ipython.get_ipython() if ipython is not None else None
  if shell is None or getattr(shell, "_hostcall_end_of_cell", False):
    return False
  shell.events.register("post_run_cell", _end_of_cell)
  shell._hostcall_end_of_cell = True
  return True
