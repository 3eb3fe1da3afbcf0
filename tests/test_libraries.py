"""hostcall's native libraries (``_core/libraries.py``): one a component,
neither calling the other, each registering its handlers for the platforms
the emission table gives them."""

import shutil
import subprocess

import jax
import pytest

from hostcall._apps.control import native as control_native
from hostcall._async import native as queue_native
from hostcall._core import emission, libraries


def _loaded(library):
  if library.load() is None:
    pytest.skip(f"the {library.what} library cannot be had here "
                f"({library.error})")
  return library


def test_each_component_has_a_library_that_calls_nothing_of_the_other():
  queue, control = _loaded(queue_native.LIBRARY), _loaded(
      control_native.LIBRARY)
  assert queue.path() != control.path()
  assert queue.path().name.startswith("hostcall_queue-")
  assert control.path().name.startswith("hostcall_control-")
  nm = shutil.which("nm")
  if nm is None:
    pytest.skip("no nm to list the libraries' symbols")

  def symbols(path, *flags):
    out = subprocess.run([nm, "-D", *flags, str(path)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines()
            if line.split()[-1].startswith("hostcall_")}

  # What each defines is its own; neither needs a hostcall_ symbol.
  assert "hostcall_enqueue" in symbols(queue.path(), "--defined-only")
  assert "hostcall_control_check" in symbols(control.path(),
                                             "--defined-only")
  assert not symbols(queue.path(), "--defined-only") & symbols(
      control.path(), "--defined-only")
  assert symbols(queue.path(), "--undefined-only") == set()
  assert symbols(control.path(), "--undefined-only") == set()


def test_a_library_registers_its_handlers_for_each_platform_of_the_table(
    monkeypatch):
  # Adding a platform is a row of emission.NATIVE: the library registers
  # the handlers the row names there, and only those.
  source = _loaded(control_native.LIBRARY)
  registered = []
  monkeypatch.setattr(jax.ffi, "register_ffi_target",
                      lambda name, capsule, platform: registered.append(
                          (name, platform)))
  monkeypatch.setattr(emission, "NATIVE", {
      "cpu": frozenset({"enqueue", "check"}),
      "cuda": frozenset({"check"}),
      "rocm": frozenset({"enqueue"}),
  })
  fresh = libraries.Library(source.name, source.sources, source.signatures,
                            source.handlers, source.what, source.fallback)
  assert fresh.load() is not None
  assert sorted(registered) == [("hostcall_control_check", "cpu"),
                                ("hostcall_control_check", "cuda")]
