"""hostcall's native code (``_runtime/libraries.py``): one extension module,
built when the package is installed, in which each component finds its own
functions, neither calling the other, each registering its handlers for the
platforms the emission table gives them."""

import importlib.util
import shutil
import subprocess
import sysconfig

import jax
import pytest

from hostcall._apps.control import stop_states_library as control_native
from hostcall._runtime import emission, libraries, queue_library as queue_native


def _loaded(library):
  library.load()   # raises where the extension cannot be loaded
  return library


def test_both_components_load_the_one_installed_extension():
  queue, control = _loaded(queue_native.LIBRARY), _loaded(
      control_native.LIBRARY)
  path = libraries.extension_path()
  assert queue.path() == control.path() == path
  # The import system's file for hostcall._native, named for this Python.
  assert path.name == "_native" + sysconfig.get_config_var("EXT_SUFFIX")
  assert str(path) == importlib.util.find_spec("hostcall._native").origin
  assert path.parent.name == "hostcall"


def test_each_component_calls_nothing_of_the_other():
  queue, control = _loaded(queue_native.LIBRARY), _loaded(
      control_native.LIBRARY)
  nm = shutil.which("nm")
  if nm is None:
    pytest.skip("no nm to list the extension's symbols")
  out = subprocess.run([nm, "-D", "--defined-only", str(queue.path())],
                       capture_output=True, text=True, check=True).stdout
  defined = {line.split()[-1] for line in out.splitlines()}
  # Every function and handler either component looks up is there.
  for library in (queue, control):
    for symbol in library.signatures:
      assert symbol in defined, symbol
    for symbols in library.handlers.values():
      assert set(symbols) <= defined
  assert "PyInit__native" in defined
  # Each names only its own: the queue's are hostcall_ and not
  # hostcall_control_, the stop check's hostcall_control_.
  assert all(not s.startswith("hostcall_control_") for s in queue.signatures)
  assert all(s.startswith("hostcall_control_") for s in control.signatures)
  undefined = subprocess.run([nm, "-D", "--undefined-only", str(queue.path())],
                             capture_output=True, text=True,
                             check=True).stdout
  assert "hostcall_" not in undefined


def test_a_library_registers_its_handlers_for_each_platform_of_the_table(
    monkeypatch):
  # Adding a platform is a row of emission.PLATFORMS: the library registers
  # the handlers the row names there, and only those.
  source = _loaded(control_native.LIBRARY)
  registered = []
  monkeypatch.setattr(jax.ffi, "register_ffi_target",
                      lambda name, capsule, platform: registered.append(
                          (name, platform)))
  monkeypatch.setattr(emission, "PLATFORMS", {
      "cpu": emission.Platform(frozenset({"enqueue", "check"}), True),
      "cuda": emission.Platform(frozenset({"check"})),
      "rocm": emission.Platform(frozenset({"enqueue"})),
  })
  fresh = libraries.Library(source.name, source.signatures, source.handlers,
                            source.what)
  assert fresh.load() is not None
  assert sorted(registered) == [("hostcall_control_check", "cpu"),
                                ("hostcall_control_check", "cuda"),
                                ("hostcall_control_finish", "cpu"),
                                ("hostcall_control_finish", "cuda")]


def test_a_platform_is_one_row_of_the_table(monkeypatch, request):
  # What hostcall does on a platform follows its row alone: how calls are
  # emitted, whether hostcall.jit queues from the device, and whether its
  # outputs route starts copies ahead.
  import types
  from hostcall._runtime import outputs_replay
  from hostcall._jit import routes
  request.addfinalizer(routes.forget_process)  # (found again, not faked)

  def lowering_on(name):
    module = types.SimpleNamespace(platforms=[name], axis_context=None)
    return types.SimpleNamespace(module_context=module)

  request.addfinalizer(outputs_replay._host_buffers.cache_clear)
  fake = emission.Platform(native=frozenset({"enqueue"}), host_buffers=False)
  monkeypatch.setattr(emission, "PLATFORMS", {"fake": fake})
  assert emission.route(lowering_on("fake"), "enqueue", True) == "ffi"
  assert emission.route(lowering_on("fake"), "check", True) == "python"
  assert emission.route(lowering_on("fake"), "call", True) == "python"
  assert emission.route(lowering_on("cpu"), "enqueue", True) == "python"
  assert emission.platform("cpu") == emission.Platform()
  monkeypatch.setattr(jax, "default_backend", lambda: "fake")
  routes.forget_process()
  outputs_replay._host_buffers.cache_clear()
  assert routes.process().queues is True
  assert routes.chosen() in (routes.Queued, routes.QueuedOnSeveral)
  assert outputs_replay._host_buffers() is False
  monkeypatch.setattr(emission, "PLATFORMS", {"fake": emission.Platform(
      host_buffers=True)})
  routes.forget_process()
  outputs_replay._host_buffers.cache_clear()
  assert routes.process().queues is False
  assert routes.chosen() is routes.AsOutputs
  assert outputs_replay._host_buffers() is True


def test_a_missing_extension_is_a_clear_error_naming_the_fix(monkeypatch):
  monkeypatch.setattr(libraries, "EXTENSION", "hostcall._not_installed")
  monkeypatch.delenv("HOSTCALL_NATIVE", raising=False)
  source = queue_native.LIBRARY
  fresh = libraries.Library(source.name, source.signatures, source.handlers,
                            source.what)
  assert libraries.extension_path() is None and fresh.path() is None
  with pytest.raises(libraries.HostcallNativeError) as raised:
    fresh.load()
  message = str(raised.value)
  assert message.startswith("hostcall: the native tap queue is not "
                            "available: hostcall's native extension "
                            "hostcall._not_installed is not installed")
  assert "`pip install .`, or `pip install -e .` in a source tree" in message
  assert fresh.status().startswith("unavailable (hostcall's native")
  with pytest.raises(libraries.HostcallNativeError) as again:
    fresh.load()   # each use, the same words
  assert str(again.value) == message and fresh.loaded() is None


def test_hostcall_native_0_loads_the_library_but_registers_no_handler(
    monkeypatch):
  monkeypatch.setenv("HOSTCALL_NATIVE", "0")
  registered = []
  monkeypatch.setattr(jax.ffi, "register_ffi_target",
                      lambda *args, **kwargs: registered.append(args))
  source = control_native.LIBRARY
  fresh = libraries.Library(source.name, source.signatures, source.handlers,
                            source.what)
  assert fresh.load() is not None and fresh.loaded() is not None
  assert fresh.error is None and fresh.ffi is False and registered == []
  assert "reached through JAX's callbacks (HOSTCALL_NATIVE=0" in (
      fresh.status())
