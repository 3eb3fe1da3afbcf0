"""hostcall's native extension is built when the package is installed
(scikit-build-core with CMake: pyproject.toml, CMakeLists.txt) and loaded
from the package: nothing is compiled, cached or written at run time, a
wheel built once installs and runs without a compiler, and a build without
a compiler fails saying what is missing."""

import os
import pathlib
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

import pytest

from hostcall._runtime import libraries

ROOT = pathlib.Path(__file__).parent.parent
EXT_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX")

# An asynchronous tap, a steered loop, and which paths they took.
_TAP = """
    import warnings
    warnings.simplefilter("error")   # any warning: an error
    import jax, jax.numpy as jnp, hostcall
    from hostcall import host_callback as hcb
    from hostcall._apps.control import controls
    from hostcall._runtime import queue_library
    seen = []
    jax.jit(lambda x: hcb.id_tap(lambda v, t: seen.append(float(v)), x * 2,
                                 delivery="async"))(jnp.float32(1.5))
    hostcall.barrier()
    loop = jax.jit(lambda: hostcall.control.while_loop(
        lambda c: c < 10, lambda c: c + 1, 0, every=1, time_limit=60.0))
    print(seen, hostcall.queue_stats()["native"], controls.native,
          int(loop().value))
    print(queue_library.LIBRARY.path())
    """


def _no_compiler_env(tmp_path: pathlib.Path) -> dict:
  """An environment with no C++ compiler to be had (an empty PATH, a CXX
  that does not exist), an empty read-only HOSTCALL_CACHE and an empty
  read-only HOME."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("HOSTCALL_NATIVE", "CC")}
  for name in ("cache", "home", "bin"):
    (tmp_path / name).mkdir()
    (tmp_path / name).chmod(0o555)
  env.update(HOSTCALL_CACHE=str(tmp_path / "cache"),
             HOME=str(tmp_path / "home"), PATH=str(tmp_path / "bin"),
             CXX=str(tmp_path / "no-such-c++"), XDG_CACHE_HOME=str(
                 tmp_path / "home" / ".cache"))
  return env


def _run_tap(python, env, cwd, flags=()):
  proc = subprocess.run([str(python), *flags, "-c", textwrap.dedent(_TAP)],
                        capture_output=True, text=True, timeout=300,
                        env=env, cwd=cwd)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc.stdout.splitlines()


def _installed() -> pathlib.Path:
  path = libraries.extension_path()
  if path is None:
    pytest.skip("hostcall's native extension is not installed here")
  return path


def test_an_asynchronous_tap_writes_nothing_and_needs_no_compiler(tmp_path):
  installed = _installed()
  env = _no_compiler_env(tmp_path)
  work = tmp_path / "work"
  work.mkdir()
  out = _run_tap(sys.executable, env, cwd=work)
  # The native queue and the native stop check, both from the installed
  # extension.
  assert out == ["[3.0] True True 10", str(installed)]
  # Nothing written: not in HOSTCALL_CACHE, HOME, nor where it ran.
  assert sorted(tmp_path.rglob("*")) == sorted(
      tmp_path / name for name in ("cache", "home", "bin", "work"))


def test_the_extension_is_one_module_named_for_this_python():
  installed = _installed()
  assert installed.name == f"_native{EXT_SUFFIX}"
  # Found by the import system, not in the source tree: an editable install
  # keeps it in its own site-packages (one for each venv sharing the tree).
  assert not installed.is_relative_to(ROOT / "src")
  import hostcall._native
  assert hostcall._native.__file__ == str(installed)
  assert [n for n in dir(hostcall._native) if not n.startswith("__")] == []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
  """A wheel of this tree, built once (`pip wheel .`: the build requirements
  come from the package index)."""
  out = tmp_path_factory.mktemp("wheel")
  proc = subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
       "--disable-pip-version-check", "-w", str(out), str(ROOT)],
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  (built,) = out.glob("hostcall-*.whl")
  return built


def test_a_wheel_holds_the_extension_and_the_python_not_the_sources(wheel):
  names = zipfile.ZipFile(wheel).namelist()
  assert f"hostcall/_native{EXT_SUFFIX}" in names
  assert [n for n in names if n.endswith((".so", ".pyd", ".dylib"))] == [
      f"hostcall/_native{EXT_SUFFIX}"]
  assert not [n for n in names if n.endswith((".cc", ".c", ".h"))]
  sources = sorted(
      str(p.relative_to(ROOT / "src")) for p in
      (ROOT / "src" / "hostcall").rglob("*.py")
      if "__pycache__" not in p.parts)
  assert sorted(n for n in names if n.endswith(".py")) == sources
  # A platform wheel for this Python.
  tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
  assert wheel.name.startswith(f"hostcall-0.1.0-{tag}-{tag}-")


@pytest.mark.heavy
def test_a_wheel_installs_and_runs_where_there_is_no_compiler(wheel,
                                                              tmp_path):
  # A fresh venv holding only the wheel, the test venv's packages (jax...)
  # reached through a .pth line (not its .pth files: not the editable
  # install's redirection); no compiler on PATH, nothing written.
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                 check=True, timeout=120)
  python = venv / "bin" / "python"
  proc = subprocess.run(
      [sys.executable, "-m", "pip", "--python", str(python), "install",
       "--no-deps", "--no-index", "--quiet", "--disable-pip-version-check",
       str(wheel)], capture_output=True, text=True, timeout=300,
      env={**os.environ, "PATH": os.path.dirname(sys.executable)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  purelib = pathlib.Path(subprocess.run(
      [str(python), "-c", "import sysconfig; print(sysconfig.get_path("
       "'purelib'))"], capture_output=True, text=True,
      check=True).stdout.strip())
  (purelib / "test-venv.pth").write_text("\n".join(site.getsitepackages()))
  run = tmp_path / "run"
  run.mkdir()
  env = _no_compiler_env(run)
  out = _run_tap(python, env, cwd=run)
  assert out == ["[3.0] True True 10",
                 str(purelib / "hostcall" / f"_native{EXT_SUFFIX}")]
  assert sorted(run.rglob("*")) == sorted(
      run / name for name in ("cache", "home", "bin"))


def _cmake_configure(tmp_path, env):
  cmake = shutil.which("cmake")
  if cmake is None:
    pytest.skip("no cmake on PATH")
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in ("cmake", "ninja", "make"):
    if shutil.which(tool):
      (bin_dir / tool).symlink_to(shutil.which(tool))
  return subprocess.run(
      [cmake, "-S", str(ROOT), "-B", str(tmp_path / "build"),
       f"-DPython_EXECUTABLE={sys.executable}"],
      capture_output=True, text=True, timeout=120,
      env={**os.environ, "PATH": str(bin_dir), **env})


_NO_COMPILER = (
    "Building hostcall's native extension needs a C++17 compiler: g++ or "
    "clang++ on PATH, or one named by the CXX environment variable (e.g. "
    "apt-get install g++). A prebuilt hostcall wheel (`pip wheel .` on a "
    "machine with a compiler makes one) installs without a compiler.")


@pytest.mark.parametrize("cxx", [None, "/nonexistent/c++"])
def test_cmake_says_what_is_missing_without_a_compiler(tmp_path, cxx):
  env = {"CXX": cxx} if cxx else {}
  proc = _cmake_configure(tmp_path, env)
  assert proc.returncode != 0
  said = " ".join(proc.stderr.split())   # CMake wraps and pads the lines
  assert "CMake Error at CMakeLists.txt" in said
  if cxx:
    assert (f"hostcall: no C++ compiler found (CXX is '{cxx}', which is not "
            "a working C++ compiler). ") in said
  else:
    assert "hostcall: no C++ compiler found. " in said
  assert _NO_COMPILER in said


@pytest.mark.heavy
def test_pip_install_without_a_compiler_fails_saying_what_is_missing(
    tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "--no-deps",
       "--disable-pip-version-check", "-w", str(tmp_path), str(ROOT)],
      capture_output=True, text=True, timeout=600,
      env={**os.environ, "CXX": "/nonexistent/c++"})
  assert proc.returncode != 0
  said = " ".join((proc.stdout + proc.stderr).split())
  assert ("hostcall: no C++ compiler found (CXX is '/nonexistent/c++', "
          "which is not a working C++ compiler).") in said
  assert _NO_COMPILER in said
  assert not list(tmp_path.glob("*.whl"))
