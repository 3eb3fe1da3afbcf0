"""Runs every program of programs.py against one implementation; prints JSON.

  python runner.py hostcall   # hostcall.host_callback (jax 0.10.x)
  python runner.py legacy     # jax.experimental.host_callback (jax 0.4.34)

Options: ``--devices N`` runs only the programs for N CPU devices (1 or 4) in
this process; without it the 1-device programs run here and the 4-device ones
in a child process, and both land in the one JSON object printed:

  {"meta": {...}, "devices_1": {name: record}, "devices_4": {name: record}}

A record is ``{"ok": <the program's dict>}`` or ``{"error": {"type": ...,
"message": <first 300 characters>}}``, plus ``"leftover_barrier_error"`` when
a ``barrier_wait()`` after the program raised. ``--only a,b`` runs some
programs only.

In ``legacy`` mode the outfeed implementation of the legacy module is used
(``JAX_HOST_CALLBACK_LEGACY=1``, ``JAX_HOST_CALLBACK_OUTFEED=1`` unless set
otherwise); the values in force are recorded in ``meta``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM_TIMEOUT_S = 120


def _set_env(mode: str, devices: int) -> None:
  os.environ["JAX_PLATFORMS"] = "cpu"
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "",
                 os.environ.get("XLA_FLAGS", "")).strip()
  os.environ["XLA_FLAGS"] = (
      f"{flags} --xla_force_host_platform_device_count={devices}").strip()
  if mode == "legacy":
    os.environ.setdefault("JAX_HOST_CALLBACK_LEGACY", "1")
    os.environ.setdefault("JAX_HOST_CALLBACK_OUTFEED", "1")


def _meta(mode: str) -> dict:
  import jax
  import jaxlib
  import numpy as np
  return {
      "impl": mode,
      "python": ".".join(map(str, sys.version_info[:3])),
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "numpy": np.__version__,
      "env": {k: os.environ.get(k) for k in (
          "JAX_HOST_CALLBACK_LEGACY", "JAX_HOST_CALLBACK_OUTFEED")},
  }


def _run_isolated(mode: str, devices: int, name: str) -> dict:
  """Runs one program in a child process (see programs.isolated)."""
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), mode, "--devices",
       str(devices), "--only", name],
      stdout=subprocess.PIPE, text=True, timeout=2 * PROGRAM_TIMEOUT_S)
  if proc.returncode != 0:
    return {"error": {"type": "ProcessCrash",
                      "message": f"exit status {proc.returncode}"}}
  return json.loads(proc.stdout)[f"devices_{devices}"][name]


def run_programs(mode: str, devices: int, only: set[str] | None) -> dict:
  """Runs the programs for ``devices`` devices in this process."""
  _set_env(mode, devices)
  import warnings
  warnings.filterwarnings("ignore")
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  if mode == "legacy":
    from jax.experimental import host_callback as hcb
  else:
    from hostcall import host_callback as hcb
  sys.path.insert(0, HERE)
  import programs

  assert len(jax.devices()) == devices, jax.devices()
  results = {}
  real_stdout = sys.stdout
  sys.stdout = sys.stderr  # stray prints must not spoil the JSON
  try:
    for name, fn in programs.programs(devices).items():
      if only and name not in only:
        continue
      try:
        hcb.barrier_wait()
      except Exception:  # noqa: BLE001 - left by the previous program
        pass
      print(f"runner[{mode}, {devices}]: {name}", file=sys.stderr, flush=True)
      if (mode == "legacy" and getattr(fn, "ISOLATE", False)
          and only != {name}):
        results[name] = _run_isolated(mode, devices, name)
        continue
      faulthandler.dump_traceback_later(PROGRAM_TIMEOUT_S, exit=True)
      try:
        res = fn(hcb, jax, jnp, np, lax)
        json.dumps(res)
        record = {"ok": res}
      except Exception as e:  # noqa: BLE001
        record = {"error": {"type": type(e).__name__,
                            "message": str(e)[:300]}}
      try:
        hcb.barrier_wait()
      except Exception as e:  # noqa: BLE001
        record["leftover_barrier_error"] = type(e).__name__
      faulthandler.cancel_dump_traceback_later()
      results[name] = record
  finally:
    sys.stdout = real_stdout
  return {"meta": _meta(mode), f"devices_{devices}": results}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser()
  parser.add_argument("mode", choices=("hostcall", "legacy"))
  parser.add_argument("--devices", type=int, choices=(1, 4))
  parser.add_argument("--only", default="")
  args = parser.parse_args(argv)
  only = set(filter(None, args.only.split(","))) or None

  if args.devices:
    out = run_programs(args.mode, args.devices, only)
  else:
    cmd = [sys.executable, os.path.abspath(__file__), args.mode,
           "--devices", "4"]
    if args.only:
      cmd += ["--only", args.only]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
      out = run_programs(args.mode, 1, only)
    finally:
      child_out, _ = child.communicate()
    if child.returncode != 0:
      print(f"runner: the 4-device run failed ({child.returncode})",
            file=sys.stderr)
      return 1
    out["devices_4"] = json.loads(child_out)["devices_4"]
  json.dump(out, sys.stdout, indent=1, sort_keys=True)
  sys.stdout.write("\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
