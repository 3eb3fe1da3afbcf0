"""The native tap queue: built from ``hostcall_queue.cc`` on first use.

The C++ source is compiled against the XLA FFI headers of the installed
jaxlib (``jax.ffi.include_dir()``) with the system C++ compiler, once per
jaxlib version and source, into ``$HOSTCALL_CACHE`` (default
``~/.cache/hostcall``). If no compiler is found or the build fails, ``load()``
returns None and hostcall falls back to its pure-Python queue; ``hostcall
info`` says which is active and why.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading

import jax
import jaxlib

SOURCE = pathlib.Path(__file__).with_name("hostcall_queue.cc")
_lock = threading.Lock()
_lib = None
_error: str | None = None


def _cache_dir() -> pathlib.Path:
  root = os.environ.get("HOSTCALL_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "hostcall")
  return pathlib.Path(root)


def _library_path() -> pathlib.Path:
  digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
  return _cache_dir() / f"hostcall_queue-{jaxlib.__version__}-{digest}.so"


def _build(target: pathlib.Path) -> None:
  compiler = (os.environ.get("CXX") or shutil.which("c++")
              or shutil.which("g++") or shutil.which("clang++"))
  if compiler is None:
    raise RuntimeError("no C++ compiler (c++, g++ or clang++) on PATH")
  target.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
    out = pathlib.Path(tmp) / target.name
    cmd = [compiler, "-std=c++17", "-O2", "-fPIC", "-shared", "-w",
           f"-I{jax.ffi.include_dir()}", str(SOURCE), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
      raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    os.replace(out, target)  # atomic: concurrent builders agree


def _declare(lib) -> None:
  vp, i64, p64 = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(
      ctypes.c_int64)
  signatures = {
      "hostcall_pop": ([i64, i64, ctypes.POINTER(vp)], i64),
      "hostcall_release_many": ([ctypes.POINTER(vp), i64], None),
      "hostcall_describe": ([vp, p64], None),
      "hostcall_push_host": ([i64, i64, i64], None),
      "hostcall_become_consumer": ([], None),
      "hostcall_set_bypass": ([i64], None),
      "hostcall_set_capacity": ([i64], None),
      "hostcall_stats": ([p64], None),
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
      path = _library_path()
      if not path.exists():
        _build(path)
      lib = ctypes.CDLL(str(path))
      _declare(lib)
      # The same library, called with the GIL held: for the short calls the
      # consumer makes per item, which must not queue behind a busy Python
      # thread for the GIL (5 ms a switch). Only hostcall_pop, which waits,
      # goes through ``lib`` and releases the GIL.
      lib.held = ctypes.PyDLL(str(path))
      _declare(lib.held)
      for name in ("hostcall_enqueue", "hostcall_enqueue_ordered"):
        jax.ffi.register_ffi_target(
            name, jax.ffi.pycapsule(getattr(lib, name)), platform="cpu")
      _lib = lib
    except Exception as exc:  # noqa: BLE001 - any failure means: fall back
      _error = f"{type(exc).__name__}: {exc}"
    return _lib


def status() -> str:
  """One line: which tap queue is active, and why."""
  lib = load()
  if lib is not None:
    return f"native (XLA FFI handler, {_library_path().name})"
  return f"pure Python fallback ({_error})"
