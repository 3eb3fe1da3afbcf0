"""Runs tests/multidevice in a subprocess with 4 forced CPU devices; the fault
matrix once with each asynchronous queue (the queue is chosen when hostcall
is imported)."""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
FAULT_MATRIX = "multidevice/test_fault_matrix.py"


def _run(paths, **env):
  env = dict(os.environ,
             XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu", **env)
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       *paths], env=env, capture_output=True, text=True, timeout=600,
      cwd=HERE.parent)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
  assert " passed" in proc.stdout and "skipped" not in proc.stdout


def test_multidevice_suite_passes_on_four_cpu_devices():
  _run([str(HERE / "multidevice"), f"--ignore={HERE / FAULT_MATRIX}"])


@pytest.mark.parametrize("route", ["ffi", "callbacks"])
def test_the_fault_matrix_holds_on_either_route_into_the_queue(route):
  _run([str(HERE / FAULT_MATRIX)],
       HOSTCALL_NATIVE="1" if route == "ffi" else "0")
