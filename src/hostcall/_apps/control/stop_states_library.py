"""The stop check's native library: ``hostcall_control.cc`` (the
``hostcall_control_check`` FFI handler, each invocation's stop state,
Ctrl-C), compiled into hostcall's native extension when the package is
installed and loaded from it by ``_runtime/libraries.py`` on first use. It
calls nothing of the asynchronous queue's part of the extension."""

from __future__ import annotations

import ctypes

from hostcall._runtime import libraries

_i64 = ctypes.c_int64

#: The stop check's library.
LIBRARY = libraries.Library(
    "hostcall_control",
    signatures={
        "hostcall_control_open": ([_i64, _i64, _i64, _i64, _i64], None),
        "hostcall_control_evaluated": ([_i64], None),
        "hostcall_control_request": ([_i64, _i64], None),
        "hostcall_control_close": ([_i64], None),
        "hostcall_control_hold": ([_i64], None),
        "hostcall_control_release": ([_i64], None),
        "hostcall_control_poll": ([_i64, _i64], _i64),
        "hostcall_control_end": ([_i64], None),
        "hostcall_control_running": ([_i64], _i64),
        "hostcall_control_contain": ([_i64, _i64], _i64),
        "hostcall_control_sigint_installed": ([], _i64),
        "hostcall_control_interrupts": ([], _i64),
        "hostcall_control_predicates_open": ([], _i64),
    },
    handlers={"check": ("hostcall_control_check",
                        "hostcall_control_finish")},
    what="stop check")


def load():
  """The loaded stop-check library (its FFI handler registered unless
  ``HOSTCALL_NATIVE=0``); raises ``HostcallNativeError`` where the
  extension cannot be loaded."""
  return LIBRARY.load()
