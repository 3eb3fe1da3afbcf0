"""hostcall's native libraries: each built from its C++ sources on first
use, cached, verified and loaded (``Library``).

Two components have one each, and neither calls the other: the
asynchronous queue (``_async/native.py``: ``hostcall_queue.cc``) and the
steered loops' stop check (``_apps/control/native.py``:
``hostcall_control.cc``). A library's sources are compiled against the XLA
FFI headers of the installed jaxlib (``jax.ffi.include_dir()``) with the
system C++ compiler (``$CXX``, a command line such as ``ccache g++``, else
``c++``, ``g++`` or ``clang++``), once per jaxlib version and source, into
``$HOSTCALL_CACHE`` (default ``~/.cache/hostcall``).

What is loaded is checked first: the cache directory must belong to this
user and be writable by no one else, and the library must match the SHA-256
digest recorded when it was built (a library that does not, or that fails
to load, is rebuilt). A build goes to a temporary file renamed into place,
so that processes building at once each end up with a whole library. When
a library cannot be had its component uses its Python implementation:
without a compiler or after a failed build it says why once (a
``HostcallNativeWarning``); with ``HOSTCALL_NATIVE=0``, which asked for it,
silently. ``hostcall info`` says which is used, and why, in both cases.

Its FFI handlers are registered for every platform that the emission table
(``emission.NATIVE``) gives them.
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
import time
import warnings

import jax
import jaxlib

from hostcall._core import emission


class HostcallNativeWarning(UserWarning):
  """One of hostcall's native libraries could not be built or loaded; its
  component's Python implementation is used instead (slower, same
  guarantees)."""


def cache_dir() -> pathlib.Path:
  """Where the native library is built and kept."""
  root = os.environ.get("HOSTCALL_CACHE") or os.path.join(
      os.path.expanduser("~"), ".cache", "hostcall")
  return pathlib.Path(root)


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


def _verified(path: pathlib.Path) -> bool:
  """Whether ``path`` is a whole build of ours, as its digest says."""
  digest = path.with_suffix(".sha256")
  if not (path.exists() and digest.exists()):
    return False
  _check_private(path)
  return digest.read_text().strip() == _sha256(path)


def _build(target: pathlib.Path, sources) -> None:
  cxx = _compiler_command()
  with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
    out = pathlib.Path(tmp) / target.name
    cmd = [*cxx, "-std=c++17", "-O2", "-fPIC", "-shared", "-w",
           f"-I{jax.ffi.include_dir()}", *map(str, sources), "-o", str(out)]
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



#: What a build takes on a 2-core machine, said before one starts.
BUILD_SECONDS = 10

logger = logging.getLogger("hostcall")


class Library:
  """One native library: its sources, the C functions Python calls (and
  their ctypes signatures), and its FFI handlers by the emission table's
  handler names; built, verified and loaded on first ``load()``.

  Arguments:
    name: the library's file name stem (``hostcall_queue``).
    sources: its C++ files.
    signatures: ``{C function: (argument types, result type)}``.
    handlers: ``{emission handler ("enqueue", "check"): FFI symbols}``.
    what: what it is, for messages ("tap queue").
    fallback: what is used without it, for the warning.

  Example:
    >>> from hostcall._async import native
    >>> native.LIBRARY.name
    'hostcall_queue'
  """

  def __init__(self, name: str, sources, signatures: dict,
               handlers: dict, what: str, fallback: str):
    self.name, self.sources = name, tuple(sources)
    self.signatures, self.handlers = signatures, handlers
    self.what, self.fallback = what, fallback
    self._lock = threading.Lock()
    self._lib = None
    self.error: str | None = None
    self._building_ahead = False  # ``build()`` says it itself

  def path(self) -> pathlib.Path:
    """Where this build of the library is cached (its jaxlib and sources'
    digest in the name)."""
    digest = hashlib.sha256(b"".join(
        source.read_bytes() for source in self.sources)).hexdigest()[:16]
    return cache_dir() / f"{self.name}-{jaxlib.__version__}-{digest}.so"

  def _declare(self, lib) -> None:
    for name, (args, res) in self.signatures.items():
      fn = getattr(lib, name)
      fn.argtypes, fn.restype = args, res

  def _open(self, path: pathlib.Path):
    lib = ctypes.CDLL(str(path))
    self._declare(lib)
    # The same library, called with the GIL held: for short calls (the
    # consumer makes some per item), which must not queue behind a busy
    # Python thread for the GIL (5 ms a switch). Only the calls that may
    # wait go through ``lib``, which releases the GIL.
    lib.held = ctypes.PyDLL(str(path))
    self._declare(lib.held)
    return lib

  def _load_or_build(self):
    directory = cache_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_private(directory)
    path = self.path()
    for attempt in range(2):
      if attempt or not _verified(path):
        if not attempt and not self._building_ahead:
          # The first call that needs it waits for the build: say so, once
          # (a warning, so that it shows where nothing configured logging).
          logger.warning(
              "hostcall: building the native %s, once for this jaxlib "
              "(about %d s), into %s; `hostcall info --build` builds it "
              "ahead.", self.what, BUILD_SECONDS, directory)
        _build(path, self.sources)
      try:
        return self._open(path)
      except OSError:
        if attempt:
          raise  # a fresh build that does not load: give up
    raise AssertionError("unreachable")

  def load(self):
    """The loaded library with its FFI handlers registered, or None (then
    ``error`` says why)."""
    with self._lock:
      if self._lib is not None or self.error is not None:
        return self._lib
      if os.environ.get("HOSTCALL_NATIVE", "1") == "0":
        self.error = "disabled by HOSTCALL_NATIVE=0"
        return None
      try:
        lib = self._load_or_build()
        for platform, served in emission.NATIVE.items():
          for handler, symbols in self.handlers.items():
            if handler in served:
              for symbol in symbols:
                jax.ffi.register_ffi_target(
                    symbol, jax.ffi.pycapsule(getattr(lib, symbol)),
                    platform=platform)
        self._lib = lib
      except Exception as exc:  # noqa: BLE001 - any failure means: fall back
        self.error = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"hostcall: the native {self.what} is not available "
            f"({self.error}); {self.fallback}. `hostcall info` shows this "
            "again.", HostcallNativeWarning, stacklevel=3)
      return self._lib

  def loaded(self):
    """The library if ``load()`` has loaded it, else None."""
    return self._lib

  def built(self) -> bool:
    """Whether this build of the library is in the cache, verified."""
    try:
      return _verified(self.path())
    except Exception:  # noqa: BLE001 - load() says what is wrong
      return False

  def build(self) -> tuple[bool, str]:
    """Builds (or loads) the library now: ``(whether it is available, one
    line saying what happened)``."""
    fresh = not (os.environ.get("HOSTCALL_NATIVE", "1") != "0"
                 and self.built())
    start = time.monotonic()
    self._building_ahead = True
    try:
      lib = self.load()
    finally:
      self._building_ahead = False
    seconds = time.monotonic() - start
    if lib is None:
      return False, f"not available: {self.error}"
    if fresh:
      return True, f"built in {seconds:.1f} s: {self.path()}"
    return True, f"already built: {self.path()}"

  def status(self) -> str:
    """One line: the library in use, or why its fallback is."""
    if self.load() is not None:
      return f"native (XLA FFI handler, {self.path()})"
    return f"pure Python fallback ({self.error})"
