"""hostcall.host_callback against the removed jax.experimental.host_callback.

tests/legacy/programs.py holds programs ported from the legacy module's own
test-suite (jax-v0.4.34). expected_legacy.json is what they gave with jax
0.4.34's legacy outfeed implementation (its "meta" says which environment);
``python tests/legacy/runner.py legacy > tests/legacy/expected_legacy.json``
in such an environment regenerates it.

* ``test_program_matches_legacy`` (normal suite): runs the programs against
  hostcall and compares each with the golden file, except the deliberate
  differences in ``KNOWN_DIFFERENCES``.
* ``test_legacy_golden_file_is_current`` (``make test-legacy``): re-runs the
  legacy side in a virtual environment with jax 0.4.34 (.venv-legacy) and
  checks that it still gives the golden file.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent.parent
RUNNER = HERE / "runner.py"
EXPECTED_PATH = HERE / "expected_legacy.json"
EXPECTED = json.loads(EXPECTED_PATH.read_text())
LEGACY_VENV = ROOT / ".venv-legacy"
LEGACY_REQUIREMENTS = ["jax==0.4.34", "jaxlib==0.4.34", "numpy<2"]

# Programs where hostcall differs from the legacy module on purpose, with why.
_CALL_FAILS = (
    "hostcall fails the computation with an error naming the cause and does "
    "not raise it again at the next barrier_wait; the legacy module failed "
    "with an opaque infeed-size error and postponed the cause to "
    "barrier_wait as CallbackException.")

KNOWN_DIFFERENCES: dict[str, str] = {
    "call_no_result": _CALL_FAILS,
    "call_raises": _CALL_FAILS,
    "call_raises_eager": _CALL_FAILS,
    "call_result_list_for_tuple": _CALL_FAILS,
    "call_weak_python_result_for_int": _CALL_FAILS,
    "call_wrong_dtype": _CALL_FAILS,
    "call_wrong_shape": _CALL_FAILS,
    "call_wrong_structure": _CALL_FAILS,
    "call_tuple_two_params": (
        "hostcall spreads a tuple argument over a host function of two "
        "parameters (documented in README), where the legacy call failed."),
    "call_result_shape_dtypes_kwarg": (
        "hostcall accepts result_shape_dtypes= as a synonym of result_shape "
        "(documented in README); the legacy call raised TypeError."),
    "tap_with_transform_kwarg": (
        "hostcall accepts and ignores tap_with_transform= from tutorials "
        "(documented in README); the legacy id_tap raised TypeError."),
}

_DEVICE_NAME = re.compile(r"TFRT_CPU_(\d+)")


def _normalise(s: str) -> str:
  """Undoes two renamings by JAX itself, not hostcall's doing: str(device)
  was "TFRT_CPU_0" in jax 0.4.34 and is "cpu:0" in jax 0.10, and the runtime
  error class XlaRuntimeError is now JaxRuntimeError."""
  s = _DEVICE_NAME.sub(r"cpu:\1", s)
  return "JaxRuntimeError" if s == "XlaRuntimeError" else s


def compare(legacy, ours, path="") -> list[str]:
  """The differences between two program records, as readable lines.

  Floats compare with a relative tolerance of 1e-5; error records compare by
  exception type only (their "message" differs by construction: the key
  words that matter are checked by the programs themselves).
  """
  if isinstance(legacy, dict) and isinstance(ours, dict):
    diffs = []
    for k in sorted(set(legacy) | set(ours)):
      if k == "message" and path.endswith("/error"):
        continue
      if k not in legacy:
        diffs.append(f"{path}/{k}: only in hostcall: {_short(ours[k])}")
      elif k not in ours:
        diffs.append(f"{path}/{k}: only in legacy: {_short(legacy[k])}")
      else:
        diffs += compare(legacy[k], ours[k], f"{path}/{k}")
    return diffs
  if isinstance(legacy, list) and isinstance(ours, list):
    if len(legacy) != len(ours):
      return [f"{path}: legacy has {len(legacy)} items, hostcall "
              f"{len(ours)}: {_short(legacy)} vs {_short(ours)}"]
    return [d for i, (a, b) in enumerate(zip(legacy, ours))
            for d in compare(a, b, f"{path}[{i}]")]
  if isinstance(legacy, str) and isinstance(ours, str):
    if _normalise(legacy) != _normalise(ours):
      return [f"{path}: legacy {legacy!r} vs hostcall {ours!r}"]
    return []
  if (isinstance(legacy, (int, float)) and isinstance(ours, (int, float))
      and not isinstance(legacy, bool) and not isinstance(ours, bool)):
    if isinstance(legacy, float) or isinstance(ours, float):
      if math.isclose(legacy, ours, rel_tol=1e-5, abs_tol=1e-6):
        return []
    elif legacy == ours:
      return []
  elif legacy == ours and type(legacy) is type(ours):
    return []
  return [f"{path}: legacy {_short(legacy)} vs hostcall {_short(ours)}"]


def _short(x, n=300) -> str:
  s = json.dumps(x, sort_keys=True)
  return s if len(s) <= n else s[:n] + "..."


def _run(python: str, mode: str, env_extra=None, timeout=300) -> dict:
  env = dict(os.environ, **(env_extra or {}))
  for k in ("JAX_PLATFORMS", "XLA_FLAGS"):  # the runner sets its own
    env.pop(k, None)
  proc = subprocess.run([python, str(RUNNER), mode], capture_output=True,
                        text=True, timeout=timeout, env=env, cwd=HERE)
  assert proc.returncode == 0, proc.stderr[-6000:]
  return json.loads(proc.stdout)


def _names():
  return [(d, n) for d in ("devices_1", "devices_4")
          for n in sorted(EXPECTED[d])]


@pytest.fixture(scope="module")
def hostcall_run():
  return _run(sys.executable, "hostcall")


def test_golden_file_covers_every_program():
  spec = importlib.util.spec_from_file_location(
      "_legacy_side_by_side_programs", HERE / "programs.py")
  programs = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(programs)
  for devices in (1, 4):
    assert sorted(programs.programs(devices)) == sorted(
        EXPECTED[f"devices_{devices}"]), (
            "programs.py and expected_legacy.json disagree: regenerate it "
            "with the legacy runner (see this module's docstring)")
  assert EXPECTED["meta"]["jax"] == "0.4.34"
  assert EXPECTED["meta"]["env"] == {"JAX_HOST_CALLBACK_LEGACY": "1",
                                     "JAX_HOST_CALLBACK_OUTFEED": "1"}
  assert set(KNOWN_DIFFERENCES) <= {n for _, n in _names()}


@pytest.mark.parametrize("devices,name", _names())
def test_program_matches_legacy(hostcall_run, devices, name):
  legacy = EXPECTED[devices][name]
  ours = hostcall_run[devices].get(name)
  assert ours is not None, f"{name} did not run under hostcall"
  diffs = compare(legacy, ours)
  if name in KNOWN_DIFFERENCES:
    assert diffs, (f"{name} now matches the legacy module: remove it from "
                   "KNOWN_DIFFERENCES")
    pytest.skip(f"known difference: {KNOWN_DIFFERENCES[name]}")
  assert not diffs, f"{name} differs from the legacy module:\n" + "\n".join(
      diffs[:20])


def _legacy_python() -> str:
  python = LEGACY_VENV / "bin" / "python"
  stamp = LEGACY_VENV / ".installed"
  if not stamp.exists():
    subprocess.run([sys.executable, "-m", "venv", str(LEGACY_VENV)],
                   check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                    *LEGACY_REQUIREMENTS], check=True)
    stamp.write_text("\n".join(LEGACY_REQUIREMENTS) + "\n")
  return str(python)


@pytest.mark.legacy
@pytest.mark.skipif(os.environ.get("HOSTCALL_TEST_LEGACY") != "1",
                    reason="needs jax 0.4.34 in .venv-legacy: run "
                    "`make test-legacy` (sets HOSTCALL_TEST_LEGACY=1)")
def test_legacy_golden_file_is_current():
  live = _run(_legacy_python(), "legacy",
              {"JAX_HOST_CALLBACK_LEGACY": "1",
               "JAX_HOST_CALLBACK_OUTFEED": "1"}, timeout=900)
  for k in ("jax", "jaxlib", "env"):
    assert live["meta"][k] == EXPECTED["meta"][k], k
  diffs = compare({d: EXPECTED[d] for d in ("devices_1", "devices_4")},
                  {d: live[d] for d in ("devices_1", "devices_4")})
  assert not diffs, ("the legacy module no longer gives "
                     "expected_legacy.json:\n" + "\n".join(diffs[:40]))
