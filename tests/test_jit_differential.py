"""Every tap test program, run again with ``jax.jit`` replaced by
``hostcall.jit`` (tests/jit_differential/plugin.py), must see the same host
calls, values, order and transforms, and return the same results.

Deselected: what hostcall.jit documents as different (docs/performance.md,
"A Python loop over a jitted step"): a failing host function is reported by
the next barrier instead of failing the call, and rows logged by several
calls reach a metrics writer as one block. Both ways hostcall.jit takes
calls out are run: queued from the device and deferred to outputs.
"""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent

FILES = ["test_id_tap.py", "test_id_print.py", "test_debug.py",
         "test_io_callback.py", "test_buffered.py", "test_metrics.py",
         "test_call.py", "test_pure_callback.py", "test_contracts.py",
         "test_roundtrip.py", "test_progress.py"]

DIFFERENT = {
    # A failure is reported by the barrier, not by the call.
    "test_debug.py::test_exception_in_debug_callback_fails_the_call",
    "test_contracts.py::"
    "test_a_tap_failure_waits_for_the_barrier_a_debug_failure_does_not",
    # Rows logged by several calls reach the writer as one block.
    "test_metrics.py::"
    "test_the_writer_joins_waiting_blocks_with_the_same_columns",
    # Ticks of a bar that reach the host together are drawn once.
    "test_progress.py::test_ticks_are_few_and_redraws_throttled",
}


@pytest.mark.parametrize("mode", ["auto", "outputs"])
def test_tap_programs_see_the_same_under_hostcall_jit(mode):
  # auto: queued from the device (one CPU device, the native queue);
  # outputs: deferred to the program's outputs, as on other devices.
  deselect = [arg for name in sorted(DIFFERENT)
              for arg in ("--deselect", f"tests/{name}")]
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       "-p", "tests.jit_differential.plugin", *deselect,
       *[f"tests/{f}" for f in FILES]],
      capture_output=True, text=True, timeout=900, cwd=HERE.parent,
      env=dict(os.environ, HOSTCALL_JIT_MODE=mode))
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
  assert " passed" in proc.stdout
