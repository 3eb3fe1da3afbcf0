"""hostcall's native code: one extension module, ``hostcall._native``,
built when the package is installed and loaded from it (``Library``).

The extension (``CMakeLists.txt``, built by scikit-build-core with CMake
at ``pip install``) holds the C++ of two components that do not call each
other: the asynchronous queue (``_runtime/queue_library.py``:
``hostcall_queue.cc``, with the metrics writers' ``hostcall_texts.cc``)
and the steered loops' stop check (``_apps/control/stop_states_library.py``:
``hostcall_control.cc``). Each component has its ``Library``: the C
functions it calls through ctypes and the XLA FFI handlers it registers,
all looked up in the one extension file, which the import system finds
where pip put it (a wheel's or an editable install's site-packages) under
a name that holds the Python version. Nothing is compiled, written or
cached at run time.

Each mechanism has this one implementation. When the extension cannot be
had (a source tree imported without being installed, a file that does not
load), the first use of a component raises ``HostcallNativeError`` naming
the fix; the host calls that need no native code (synchronous callbacks)
still run. ``HOSTCALL_NATIVE=0`` loads the extension but registers none of
its FFI handlers: every host call then takes JAX's callback path, as on a
platform the emission table gives no handler (its Python callbacks reach
the same native queue and stop states). ``hostcall info`` says which.

Its FFI handlers are registered for every platform that the emission table
(``emission.PLATFORMS``) gives them.
"""


from __future__ import annotations

import ctypes
import importlib.util
import os
import pathlib
import threading

import jax

from hostcall._runtime import emission

#: The extension module holding the native code.
EXTENSION = "hostcall._native"

#: What builds it, for messages.
INSTALL = "`pip install .`, or `pip install -e .` in a source tree"


class HostcallNativeError(ImportError):
  """hostcall's native extension could not be loaded: the asynchronous
  queue, the steered loops' stop check and the number formatting of the
  metrics writers need it (synchronous host calls do not). Raised at each
  use of those; the message names why and the fix (installing hostcall,
  which builds the extension).

  Example:
    >>> import hostcall
    >>> issubclass(hostcall.HostcallNativeError, ImportError)
    True
  """


def extension_path() -> pathlib.Path | None:
  """Where the import system finds the extension (a file), or None."""
  try:
    spec = importlib.util.find_spec(EXTENSION)
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.origin or not os.path.isfile(spec.origin):
    return None
  return pathlib.Path(spec.origin)


def missing() -> str:
  """Why there is no extension, with the fix: one line."""
  where = pathlib.Path(__file__).parent.parent   # the package
  return (f"hostcall's native extension {EXTENSION} is not installed with "
          f"the hostcall imported from {where}; installing hostcall builds "
          f"it ({INSTALL})")


class Library:
  """One component's part of the native extension: the C functions Python
  calls (and their ctypes signatures) and its FFI handlers by the emission
  table's handler names; loaded on first ``load()``.

  Arguments:
    name: the component's name in the extension (``hostcall_queue``).
    signatures: ``{C function: (argument types, result type)}``.
    handlers: ``{emission handler ("enqueue", "check"): FFI symbols}``.
    what: what it is, for messages ("tap queue").

  Example:
    >>> from hostcall._runtime import queue_library
    >>> queue_library.LIBRARY.name
    'hostcall_queue'
  """

  def __init__(self, name: str, signatures: dict, handlers: dict,
               what: str):
    self.name = name
    self.signatures, self.handlers = signatures, handlers
    self.what = what
    self._lock = threading.Lock()
    self._lib = None
    self._path: pathlib.Path | None = None
    self.error: str | None = None
    #: Whether its FFI handlers are registered (not with
    #: ``HOSTCALL_NATIVE=0``): the emission table's "handlers" column.
    self.ffi = False

  def path(self) -> pathlib.Path | None:
    """The extension file this library is loaded from (or would be), or
    None where there is none."""
    return self._path or extension_path()

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
    lib.gil_held = ctypes.PyDLL(str(path))
    self._declare(lib.gil_held)
    return lib

  def load(self):
    """The loaded library, its FFI handlers registered unless
    ``HOSTCALL_NATIVE=0``. Raises ``HostcallNativeError`` (each time, the
    same words) where the extension cannot be loaded."""
    with self._lock:
      if self._lib is None and self.error is None:
        self._load()
      if self._lib is None:
        raise HostcallNativeError(
            f"hostcall: the native {self.what} is not available: "
            f"{self.error}")
      return self._lib

  def _load(self) -> None:
    path = extension_path()
    try:
      if path is None:
        raise ModuleNotFoundError(missing())
      lib = self._open(path)
      register = os.environ.get("HOSTCALL_NATIVE", "1") != "0"
      for platform in emission.PLATFORMS if register else ():
        for handler, symbols in self.handlers.items():
          if emission.serves(platform, handler):
            for symbol in symbols:
              jax.ffi.register_ffi_target(
                  symbol, jax.ffi.pycapsule(getattr(lib, symbol)),
                  platform=platform)
      self._lib, self._path, self.ffi = lib, path, register
    except Exception as exc:  # noqa: BLE001 - each says why, with the fix
      if isinstance(exc, ModuleNotFoundError):
        self.error = str(exc)
      else:
        self.error = (f"{type(exc).__name__} loading {path}: {exc}; "
                      f"reinstalling hostcall builds it again ({INSTALL})")

  def loaded(self):
    """The library if ``load()`` has loaded it, else None."""
    return self._lib

  def status(self) -> str:
    """One line: the library in use and how the device reaches it, or why
    there is none."""
    try:
      self.load()
    except HostcallNativeError:
      return f"unavailable ({self.error})"
    if self.ffi:
      return f"native (XLA FFI handler, {self._path})"
    return (f"native ({self._path}), reached through JAX's callbacks "
            "(HOSTCALL_NATIVE=0: no FFI handler registered)")
