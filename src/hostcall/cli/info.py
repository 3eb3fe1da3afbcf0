"""Versions, devices, the host paths in use and the extras installed."""

from __future__ import annotations

import importlib.metadata
import sys

HELP = "versions, devices and which host path is active"


def _version(distribution: str) -> str:
  try:
    return importlib.metadata.version(distribution)
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def _supported_jax() -> str:
  try:
    requires = importlib.metadata.requires("hostcall") or []
  except importlib.metadata.PackageNotFoundError:
    return "unknown (hostcall is not installed as a package)"
  pins = [r.split(";")[0].strip() for r in requires
          if r.split(";")[0].strip().startswith(("jax>", "jax=", "jax<",
                                                  "jaxlib"))
          and "extra ==" not in r]
  return ", ".join(pins) or "unknown"


def add_arguments(parser) -> None:
  """No options: the native extension is built when hostcall is installed
  (there is nothing left to build ahead)."""


def run(args) -> int:
  import jax
  import jaxlib
  import numpy

  import hostcall
  from hostcall._apps.metrics import registry
  from hostcall._apps.control import stop_states_library as control_native
  from hostcall._core import delivery
  from hostcall._runtime import libraries, queue_library, tap_queue

  print(f"hostcall {hostcall.__version__}")
  print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"numpy {numpy.__version__}, python {sys.version.split()[0]}")
  print(f"supported: {_supported_jax()}")
  print(f"backend {jax.default_backend()}: {jax.devices()}")
  print(f"processes: {jax.process_count()} (this one: {jax.process_index()})")
  print("sync taps: jax.interpreters.mlir.emit_python_callback "
        "(ordered by JAX effect tokens)")
  print(f"async taps: {queue_library.status()}")
  print(f"steered loops' checks: {control_native.LIBRARY.status()}")
  extension = libraries.extension_path()
  print("native extension: " + (
      f"{extension} (built when hostcall was installed)" if extension
      else f"not installed ({libraries.missing()})"))
  # (Read without starting the queue, which needs the extension.)
  print(f"queue capacity: {tap_queue.consumer.capacity} bytes")
  print(f"default delivery: {delivery.current()}")
  widgets = _version("ipywidgets")
  print("notebook widgets: " + (
      f"ipywidgets {widgets} (widget bars in Jupyter)"
      if widgets != "not installed" else
      "not installed (text bars in Jupyter; pip install 'hostcall[notebook]')"))
  # The metrics writers' extras come from their registry: a new writer
  # behind an extra shows here without an edit.
  needed = [d for entry in registry.extras() for d in entry.requires]
  print("extras: " + ", ".join(
      _extra(name) for name in dict.fromkeys(
          ["tqdm", "pandas", "matplotlib", "scipy", *needed])))
  print("metrics writers: " + ", ".join(
      _writer(entry) for entry in registry.WRITERS))
  return 0


#: What needs each extra that no metrics writer names, and how to add it.
_NEEDED_BY = {
    "pandas": "hostcall.metrics.read's DataFrame; pip install 'hostcall[pandas]'",
    "matplotlib": "hostcall plot and the demo's chart; "
                  "pip install 'hostcall[plot]'",
    "scipy": "hostcall demo; pip install 'hostcall[demo]'",
}


def _extra(name: str) -> str:
  """An extra's version, or that it is not installed, what needs it and
  how to add it."""
  version = _version(name)
  if version == "not installed" and name in _NEEDED_BY:
    return f"{name} not installed (for {_NEEDED_BY[name]})"
  return f"{name} {version}"


def _writer(entry) -> str:
  """A named writer, and the extra it needs if any: installed or how to."""
  if entry.extra is None:
    return entry.name
  missing = [d for d in entry.requires if _version(d) == "not installed"]
  if missing:
    return f"{entry.name} (not installed: {entry.hint()})"
  versions = ", ".join(f"{d} {_version(d)}" for d in entry.requires)
  return f"{entry.name} ({versions})"
