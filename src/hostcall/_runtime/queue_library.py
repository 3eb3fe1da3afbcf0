"""The asynchronous queue's native library: ``hostcall_queue.cc`` (the
``hostcall_enqueue`` FFI handlers, ``hostcall_new_handle``, which makes a
queued open's handle, and the C functions the consumer calls),
``hostcall_thinned.cc`` (the handlers of calls the device may drop: a
bar's ticks) and the number formatting of ``texts.py``
(``hostcall_texts.cc``), compiled into hostcall's native
extension when the package is installed and loaded from it by
``_runtime/libraries.py`` on first use."""

from __future__ import annotations

import ctypes

from hostcall._runtime import libraries

_vp, _i64 = ctypes.c_void_p, ctypes.c_int64
_p64 = ctypes.POINTER(ctypes.c_int64)

#: The queue's library.
LIBRARY = libraries.Library(
    "hostcall_queue",
    signatures={
        "hostcall_pop": ([_i64, _i64, _i64, ctypes.POINTER(_vp)], _i64),
        "hostcall_add_waiters": ([_i64], None),
        "hostcall_flush_soon": ([], None),
        "hostcall_uncount_many": ([ctypes.POINTER(_vp), _i64], None),
        "hostcall_free": ([_vp], None),
        "hostcall_describe": ([_vp, _p64], None),
        "hostcall_describe_many": ([ctypes.POINTER(_vp), _i64, _p64], None),
        "hostcall_copy_free_many": ([ctypes.POINTER(_vp), _i64, _i64, _vp],
                                    None),
        "hostcall_push_host": ([_i64, _i64, _i64], None),
        "hostcall_become_consumer": ([], None),
        "hostcall_set_bypass": ([_i64], None),
        "hostcall_set_capacity": ([_i64], None),
        "hostcall_stats": ([_p64], None),
        "hostcall_rows_capacity": ([_i64, _i64, _p64], _i64),
        "hostcall_format_rows": ([_i64, _i64, _p64, ctypes.POINTER(_vp),
                                  ctypes.POINTER(ctypes.c_char_p), _p64,
                                  _i64, ctypes.c_char_p], _i64),
        "hostcall_write_rows": ([_i64, _i64, _i64, _p64, ctypes.POINTER(_vp),
                                 ctypes.POINTER(ctypes.c_char_p), _p64, _i64,
                                 _i64, ctypes.c_char_p, _p64], _i64),
    },
    handlers={"enqueue": ("hostcall_enqueue", "hostcall_enqueue_ordered",
                         "hostcall_enqueue_threaded",
                         "hostcall_enqueue_after",
                         "hostcall_enqueue_thinned",
                         "hostcall_enqueue_thinned_after",
                         "hostcall_new_handle")},
    what="tap queue")


def load():
  """The loaded queue library (its FFI handlers registered unless
  ``HOSTCALL_NATIVE=0``); raises ``libraries.HostcallNativeError`` where
  the extension cannot be loaded."""
  return LIBRARY.load()


def status() -> str:
  """One line: the tap queue and how the device reaches it."""
  return LIBRARY.status()


def ffi() -> bool:
  """Whether the device reaches the queue through its FFI handlers (not
  with ``HOSTCALL_NATIVE=0``); loads the library."""
  LIBRARY.load()
  return LIBRARY.ffi
