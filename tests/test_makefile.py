"""The Makefile's set-up: `make demo` installs only the demo's extra, `make
test` the test extra, each once, in either order (dry runs: `make -n`)."""

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None,
                                reason="no make")


@pytest.fixture
def checkout(tmp_path):
  # The install depends on the native extension's sources too.
  for name in ("Makefile", "pyproject.toml", "CMakeLists.txt"):
    shutil.copy(ROOT / name, tmp_path / name)
  return tmp_path


def _dry(checkout, target):
  # Run from `make test` (or CI's make), the outer make's variables would
  # make this one print its directory changes: a make of its own.
  env = {k: v for k, v in os.environ.items()
         if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
  proc = subprocess.run(["make", "--no-print-directory", "-n", target,
                         "PYTHON=python3"],
                        cwd=checkout, capture_output=True, text=True,
                        timeout=60, env=env)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout


def _installs(commands: str) -> list[str]:
  # The extras installed with hostcall (the build requirements are
  # installed first, in a command of their own).
  return [line.split("-e ")[1] for line in commands.splitlines()
          if "pip install" in line and " -e " in line]


def _do(checkout, target):
  """Runs what ``make target`` would install, as the stamps it leaves."""
  (checkout / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
  (checkout / ".venv" / "bin" / "python").touch()
  for extra in _installs(_dry(checkout, target)):
    (checkout / ".venv" / f".installed-{extra[3:-2]}").touch()


def test_demo_installs_only_the_demo_extra_and_starts_the_demo(checkout):
  commands = _dry(checkout, "demo")
  assert _installs(commands) == ["'.[demo]'"]
  assert commands.splitlines()[-1] == ".venv/bin/python -m hostcall demo"


def test_test_installs_the_test_extra_and_says_how_long(checkout):
  commands = _dry(checkout, "test")
  assert _installs(commands) == ["'.[test]'"]
  assert "make test: about 15 minutes on 2 CPU cores" in commands


@pytest.mark.parametrize("first,then,installs", [
    ("demo", "test", ["'.[test]'"]),
    ("test", "demo", ["'.[demo]'"]),
    ("demo", "demo", []),
    ("test", "test", []),
])
def test_each_extra_is_installed_once_in_either_order(checkout, first, then,
                                                      installs):
  _do(checkout, first)
  commands = _dry(checkout, then)
  assert _installs(commands) == installs
  assert "-m venv" not in commands  # the one venv is kept
