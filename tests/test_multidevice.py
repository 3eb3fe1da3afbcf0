"""Runs tests/multidevice in a subprocess with 4 forced CPU devices."""

import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).parent


def test_multidevice_suite_passes_on_four_cpu_devices():
  env = dict(os.environ,
             XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  proc = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
       str(HERE / "multidevice")],
      env=env, capture_output=True, text=True, timeout=600, cwd=HERE.parent)
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
  assert " passed" in proc.stdout and "skipped" not in proc.stdout
