"""The registry of named metrics writers (``_apps/metrics/registry.py``):
adding a writer is one module and one entry; ``Run(writers=[name])`` imports
it when first named, says which extra to install when its package is
missing, and ``hostcall info`` lists it and its extra's packages."""

import importlib.util
import pathlib
import re
import sys
import textwrap
import tomllib

import jax
import pytest

from hostcall import metrics
from hostcall._apps.metrics import registry
from hostcall.cli import main

ROOT = pathlib.Path(__file__).parent.parent


def test_every_writer_extra_is_a_pip_extra_that_installs_what_it_names():
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())[
      "project"]["optional-dependencies"]
  for entry in registry.extras():
    assert entry.requires, entry
    pins = [p.split(">")[0].split("=")[0].split("<")[0].strip()
            for p in extras[entry.extra]]
    assert set(entry.requires) <= set(pins), (entry, pins)
    all_pins = " ".join(extras["all"])
    assert all(name in all_pins for name in entry.requires)


def test_every_named_writer_loads(tmp_path, monkeypatch):
  monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path))
  monkeypatch.setenv("WANDB_SILENT", "true")
  packages = {"tensorboard": "tensorboardX", "mlflow": "mlflow",
              "wandb": "wandb"}
  for name in registry.entries():
    if name in packages and importlib.util.find_spec(packages[name]) is None:
      # Not installed here: the writer says which extra to install.
      with pytest.raises(ImportError, match=re.escape(
          f"pip install 'hostcall[{name}]'")):
        registry.make(name, tmp_path / name)
      continue
    writer = registry.make(name, tmp_path / name)
    assert isinstance(writer, metrics.Writer)
    writer.close()


@pytest.fixture
def extra_writers(tmp_path, monkeypatch):
  """Two writers added as a later issue adds one: a module and an entry
  (one of them behind an extra whose package is not installed)."""
  (tmp_path / "lines_writer.py").write_text(textwrap.dedent('''
      from hostcall import metrics

      class LinesWriter(metrics.Writer):
        def __init__(self, path):
          path.parent.mkdir(parents=True, exist_ok=True)
          self.file = open(path, "w")
        def write(self, block):
          for row in block.records():
            self.file.write(f"{row['step']} {row['loss']}\\n")
        def close(self):
          self.file.close()

      def for_run(run_dir):
        return LinesWriter(run_dir / "lines.txt")
      '''))
  (tmp_path / "remote_writer.py").write_text(textwrap.dedent('''
      from hostcall._apps.metrics import registry

      def for_run(run_dir):
        registry.import_extra("remote", "hostcall_no_such_package")
      '''))
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.setattr(registry, "WRITERS", registry.WRITERS + (
      registry.WriterEntry("lines", "lines_writer:for_run"),
      registry.WriterEntry("remote", "remote_writer:for_run",
                           extra="remote",
                           requires=("hostcall-no-such-package",))))
  yield
  for module in ("lines_writer", "remote_writer"):
    sys.modules.pop(module, None)


def test_a_writer_added_to_the_registry_is_named_in_runs(extra_writers,
                                                         tmp_path):
  run = metrics.Run("added", root=tmp_path, writers=["lines", "jsonl"])
  jax.jit(lambda: [run.log(i, loss=i / 2) for i in range(3)])()
  run.close()
  assert (tmp_path / "added" / "lines.txt").read_text() == (
      "0 0.0\n1 0.5\n2 1.0\n")


def test_a_writer_whose_extra_is_missing_says_what_to_install(extra_writers,
                                                              tmp_path):
  with pytest.raises(ImportError, match=r"the remote writer needs "
                     r"hostcall_no_such_package: pip install "
                     r"'hostcall\[remote\]' \(or pip install "
                     r"hostcall-no-such-package\)"):
    metrics.Run("remote", root=tmp_path, writers=["remote"])


def test_info_lists_the_registry_s_writers_and_extras(extra_writers, capsys):
  assert main(["info"]) == 0
  out = capsys.readouterr().out
  extras = next(line for line in out.splitlines()
                if line.startswith("extras: "))
  assert "hostcall-no-such-package not installed" in extras
  assert "tensorboardX" in extras
  writers = next(line for line in out.splitlines()
                 if line.startswith("metrics writers: "))
  assert writers.startswith("metrics writers: jsonl, csv, tensorboard")
  assert writers.endswith(
      ", lines, remote (not installed: pip install 'hostcall[remote]' "
      "(or pip install hostcall-no-such-package))")


# The order of docs/architecture.md's list: each module imports only from
# those before it (writer_thread knows a run only as a Sink).
LAYERS = ["block", "keys", "config", "writer", "clu", "registry", "files",
          "table", "reading", "jsonl", "csv", "tensorboard", "memory",
          "mlflow", "wandb", "processes", "writer_thread", "open_runs",
          "users", "interleaved_rows", "sink", "log_target", "log_args",
          "run", "plot"]


def test_the_metrics_modules_are_small_and_import_only_those_before():
  package = ROOT / "src" / "hostcall" / "_apps" / "metrics"
  assert sorted(p.stem for p in package.glob("*.py")) == sorted(
      LAYERS + ["__init__"])
  for index, name in enumerate(LAYERS):
    text = (package / f"{name}.py").read_text()
    assert len(text.splitlines()) <= 500, name
    imported = set(re.findall(
        r"^(?:from hostcall\._apps\.metrics(?:\.(\w+))? import ([\w, ]+)|"
        r"import hostcall\._apps\.metrics\.(\w+))", text, re.M))
    used = set()
    for module, names, plain in imported:
      if plain:
        used.add(plain)
      elif module:
        used.add(module)
      else:
        used |= {n.strip().split(" as ")[0] for n in names.split(",")}
    later = used - set(LAYERS[:index])
    assert not later, f"{name}.py imports {sorted(later)}, not before it"
