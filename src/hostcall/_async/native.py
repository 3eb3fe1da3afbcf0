"""The native tap queue: built from ``hostcall_queue.cc`` on first use.

The C++ source is compiled against the XLA FFI headers of the installed
jaxlib (``jax.ffi.include_dir()``) with the system C++ compiler (``$CXX``,
a command line such as ``ccache g++``, else ``c++``, ``g++`` or
``clang++``), once per jaxlib version and source,
into ``$HOSTCALL_CACHE`` (default ``~/.cache/hostcall``).

What is loaded is checked first: the cache directory must belong to this
user and be writable by no one else, and the library must match the SHA-256
digest recorded when it was built (a library that does not, or that fails
to load, is rebuilt). A build goes to a temporary file renamed into place,
so that processes building at once each end up with a whole library. When
no library can be had (no compiler, a failed build, ``HOSTCALL_NATIVE=0``)
hostcall falls back to its pure-Python queue, says why once (a
``HostcallNativeWarning``), and ``hostcall info`` says so too.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import pathlib
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings

import jax
import jaxlib

logger = logging.getLogger("hostcall")

#: The library's sources: the tap queue, and the stop checks of steered
#: loops (``hostcall.control``).
SOURCES = tuple(pathlib.Path(__file__).with_name(name) for name in (
    "hostcall_queue.cc", "hostcall_control.cc"))
_lock = threading.Lock()
_lib = None
_error: str | None = None


class HostcallNativeWarning(UserWarning):
  """hostcall's native tap queue could not be built or loaded; the
  pure-Python queue is used instead (slower, same guarantees)."""


def cache_dir() -> pathlib.Path:
  """Where the native library is built and kept."""
  root = os.environ.get("HOSTCALL_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "hostcall")
  return pathlib.Path(root)


def library_path() -> pathlib.Path:
  digest = hashlib.sha256(b"".join(
      source.read_bytes() for source in SOURCES)).hexdigest()[:16]
  return cache_dir() / f"hostcall_queue-{jaxlib.__version__}-{digest}.so"


def compiler() -> str | None:
  """The C++ compiler builds use (``$CXX`` as given, a command line such as
  ``ccache g++``), or None."""
  if os.environ.get("CXX", "").strip():
    return os.environ["CXX"]
  return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _compiler_command() -> list[str]:
  """The compiler's command line: ``$CXX`` split as a shell splits it (as
  make and CMake take it: ``ccache g++``, ``c++ -O1``), else the first of
  c++, g++ and clang++ on PATH; the errors name ``$CXX`` and its value."""
  cxx = os.environ.get("CXX", "")
  if cxx.strip():
    try:
      words = shlex.split(cxx)
    except ValueError as exc:
      raise RuntimeError(
          f"$CXX is {cxx!r}, which is not a command line ({exc}); set CXX to "
          "a C++ compiler, e.g. CXX=g++ or CXX='ccache g++', or unset it "
          "to use c++, g++ or clang++ from PATH") from None
    if shutil.which(words[0]) is None:
      raise RuntimeError(
          f"$CXX is {cxx!r}, but {words[0]!r} is not a program that can be "
          "run (not found, or not executable); set CXX to a C++ compiler, "
          "e.g. CXX=g++ or CXX='ccache g++', or unset it to use c++, g++ "
          "or clang++ from PATH")
    return words
  found = compiler()
  if found is None:
    raise RuntimeError("no C++ compiler (c++, g++ or clang++) on PATH; set "
                       "CXX, or install one (e.g. apt-get install g++)")
  return [found]


def _sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_private(path: pathlib.Path) -> None:
  """Refuses a path that another user owns or may write to."""
  info = path.stat()
  if hasattr(os, "getuid") and info.st_uid != os.getuid():
    raise PermissionError(f"{path} belongs to another user (uid "
                          f"{info.st_uid}); hostcall loads only its own "
                          "builds. Set HOSTCALL_CACHE to a directory of yours.")
  if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    raise PermissionError(f"{path} is writable by other users (mode "
                          f"{stat.filemode(info.st_mode)}); hostcall loads "
                          "only what no one else can change. chmod go-w it, "
                          "or set HOSTCALL_CACHE.")


def _build(target: pathlib.Path) -> None:
  cxx = _compiler_command()
  with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
    out = pathlib.Path(tmp) / target.name
    cmd = [*cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-w",
           f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", str(out)]
    source = (f" ($CXX is {os.environ['CXX']!r})"
              if os.environ.get("CXX", "").strip() else "")
    try:
      proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except OSError as exc:
      raise RuntimeError(f"{shlex.join(cmd)} could not run{source}: "
                         f"{exc}") from None
    if proc.returncode != 0:
      raise RuntimeError(f"{shlex.join(cmd)} failed{source}:\n"
                         f"{proc.stderr[-2000:]}")
    digest = pathlib.Path(tmp) / "digest"
    digest.write_text(_sha256(out))
    # The library first, then its digest: a loader that sees a library
    # without its own digest rebuilds rather than trusting it.
    os.replace(out, target)
    os.replace(digest, target.with_suffix(".sha256"))


def _verified(path: pathlib.Path) -> bool:
  """Whether ``path`` is a whole build of ours, as its digest says."""
  digest = path.with_suffix(".sha256")
  if not (path.exists() and digest.exists()):
    return False
  _check_private(path)
  return digest.read_text().strip() == _sha256(path)


def _open(path: pathlib.Path):
  lib = ctypes.CDLL(str(path))
  _declare(lib)
  # The same library, called with the GIL held: for the short calls the
  # consumer makes per item, which must not queue behind a busy Python
  # thread for the GIL (5 ms a switch). Only the calls that may wait go
  # through ``lib``, which releases the GIL.
  lib.held = ctypes.PyDLL(str(path))
  _declare(lib.held)
  return lib


#: What a build takes on a 2-core machine, said before one starts.
BUILD_SECONDS = 10
_building_ahead = False  # ``build()`` says it itself


def _load_or_build():
  directory = cache_dir()
  directory.mkdir(mode=0o700, parents=True, exist_ok=True)
  _check_private(directory)
  path = library_path()
  for attempt in range(2):
    if attempt or not _verified(path):
      if not attempt and not _building_ahead:
        # The first asynchronous tap waits for the build: say so, once (a
        # warning, so that it shows where nothing configured logging).
        logger.warning(
            "hostcall: building the native tap queue, once for this jaxlib "
            "(about %d s), into %s; `hostcall info --build` builds it ahead.",
            BUILD_SECONDS, directory)
      _build(path)
    try:
      return _open(path)
    except OSError:
      if attempt:
        raise  # a fresh build that does not load: give up
  raise AssertionError("unreachable")


def _declare(lib) -> None:
  vp, i64, p64 = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(
      ctypes.c_int64)
  signatures = {
      "hostcall_pop": ([i64, i64, i64, ctypes.POINTER(vp)], i64),
      "hostcall_hurry": ([i64], None),
      "hostcall_uncount_many": ([ctypes.POINTER(vp), i64], None),
      "hostcall_free": ([vp], None),
      "hostcall_describe": ([vp, p64], None),
      "hostcall_push_host": ([i64, i64, i64], None),
      "hostcall_become_consumer": ([], None),
      "hostcall_set_bypass": ([i64], None),
      "hostcall_set_capacity": ([i64], None),
      "hostcall_stats": ([p64], None),
      "hostcall_control_open": ([i64, i64, i64, i64, i64], None),
      "hostcall_control_evaluated": ([i64], None),
      "hostcall_control_request": ([i64, i64], None),
      "hostcall_control_close": ([i64], None),
      "hostcall_control_poll": ([i64, i64], i64),
      "hostcall_control_end": ([i64], None),
      "hostcall_control_sigint_installed": ([], i64),
      "hostcall_control_interrupts": ([], i64),
      "hostcall_control_predicates_open": ([], i64),
  }
  for name, (args, res) in signatures.items():
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = args, res


def load():
  """The loaded native library with its FFI targets registered, or None."""
  global _lib, _error
  with _lock:
    if _lib is not None or _error is not None:
      return _lib
    if os.environ.get("HOSTCALL_NATIVE", "1") == "0":
      _error = "disabled by HOSTCALL_NATIVE=0"
      return None
    try:
      lib = _load_or_build()
      for name in ("hostcall_enqueue", "hostcall_enqueue_ordered",
                   "hostcall_control_check"):
        jax.ffi.register_ffi_target(
            name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
      _lib = lib
    except Exception as exc:  # noqa: BLE001 - any failure means: fall back
      _error = f"{type(exc).__name__}: {exc}"
      warnings.warn(
          f"hostcall: the native tap queue is not available ({_error}); "
          "asynchronous taps use the pure-Python queue (same guarantees, "
          "slower). `hostcall info` shows this again.", HostcallNativeWarning,
          stacklevel=2)
    return _lib


def built() -> bool:
  """Whether the library of this jaxlib and source is in the cache."""
  return _verified_quietly(library_path())


def build() -> tuple[bool, str]:
  """Builds (or loads) the library now: ``(whether it is available, one
  line saying what happened)``."""
  import time
  global _building_ahead
  fresh = not (os.environ.get("HOSTCALL_NATIVE", "1") != "0" and built())
  start = time.monotonic()
  _building_ahead = True
  try:
    lib = load()
  finally:
    _building_ahead = False
  seconds = time.monotonic() - start
  if lib is None:
    return False, f"not available: {_error}"
  if fresh and _error is None:
    return True, f"built in {seconds:.1f} s: {library_path()}"
  return True, f"already built: {library_path()}"


def _verified_quietly(path: pathlib.Path) -> bool:
  try:
    return _verified(path)
  except Exception:  # noqa: BLE001 - load() says what is wrong
    return False


def status() -> str:
  """One line: which tap queue is active, and why."""
  lib = load()
  if lib is not None:
    return f"native (XLA FFI handler, {library_path()})"
  return f"pure Python fallback ({_error})"
