"""The named writers: what ``Run(writers=["jsonl", ...])`` makes, each
imported when a run first names it, with the pip extra it needs.

Adding a writer is one module (a ``Writer`` subclass and a ``for_run``
function) and one ``WriterEntry`` in ``WRITERS`` below; ``hostcall info``
lists the extras from here. A writer that needs a package hostcall does not
install imports it through ``import_extra``, which names the extra to
install when it is missing.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pathlib
import types
from typing import Any, Callable, Mapping

from hostcall._apps.metrics.clu import CluWriter, is_clu_writer
from hostcall._apps.metrics.writer import Writer


@dataclasses.dataclass(frozen=True)
class WriterEntry:
  """One named writer.

  Attributes:
    name: what ``Run(writers=[name])`` takes.
    load: ``"module:function"``, imported when a run first names the
      writer; ``function(run_dir)`` returns the writer of the run whose
      directory is ``run_dir`` (a ``pathlib.Path``, created by the writer
      where it writes files).
    extra: the pip extra the writer needs (``pip install
      'hostcall[<extra>]'``), or None.
    requires: the distributions that extra installs, whose versions
      ``hostcall info`` shows (as in ``pyproject.toml``).
    files: whether the writer writes files in the run's directory (made
      last by a run, after the run of the same directory it replaces has
      closed its files).
  """

  name: str
  load: str
  extra: str | None = None
  requires: tuple[str, ...] = ()
  files: bool = False

  def hint(self) -> str:
    """How to install what the writer needs."""
    return (f"pip install 'hostcall[{self.extra}]' (or pip install "
            f"{' '.join(self.requires)})")


WRITERS: tuple[WriterEntry, ...] = (
    WriterEntry("jsonl", "hostcall._apps.metrics.jsonl:for_run", files=True),
    WriterEntry("csv", "hostcall._apps.metrics.csv:for_run", files=True),
    WriterEntry("tensorboard", "hostcall._apps.metrics.tensorboard:for_run",
                extra="tensorboard", requires=("tensorboardX",), files=True),
    WriterEntry("memory", "hostcall._apps.metrics.memory:for_run"),
    WriterEntry("mlflow", "hostcall._apps.metrics.mlflow:for_run",
                extra="mlflow",
                requires=("mlflow-skinny", "sqlalchemy", "alembic")),
    WriterEntry("wandb", "hostcall._apps.metrics.wandb:for_run",
                extra="wandb", requires=("wandb",)),
)

def entries() -> dict[str, WriterEntry]:
  """The entries by name."""
  return {entry.name: entry for entry in WRITERS}


def extras() -> list[WriterEntry]:
  """The entries of the writers that need an extra."""
  return [e for e in WRITERS if e.extra is not None]


def make(spec, run_dir: pathlib.Path, name: str | None = None,
         params: Mapping[str, Any] | None = None,
         append: bool = False) -> Writer:
  """A writer from its name (one of ``WRITERS``), a ``Writer`` instance,
  or an object with CLU's ``MetricWriter`` interface (wrapped in a
  ``CluWriter``); a named writer that takes them is given the run's
  ``name``, ``params`` and ``append`` (whether to go on with the files an
  earlier run left rather than start them afresh)."""
  return maker(spec, run_dir, name, params, append)()


def maker(spec, run_dir: pathlib.Path, name: str | None = None,
          params: Mapping[str, Any] | None = None,
          append: bool = False) -> Callable[[], Writer]:
  """What ``make`` does, in two steps: the spec is checked and the named
  writer's module imported now (a missing extra raises here, before a run
  changes anything); the returned function makes the writer.

  Returns:
    A function of no arguments that returns the writer.
  """
  if isinstance(spec, Writer):
    return lambda: spec
  if is_clu_writer(spec):
    return lambda: CluWriter(spec)
  named = entries()
  if not (isinstance(spec, str) and spec in named):
    raise ValueError(f"a metrics writer is one of {sorted(named)}, a "
                     "hostcall.metrics.Writer instance or a CLU "
                     f"MetricWriter; got {spec!r}.")
  found = named[spec]
  module_name, _, function = found.load.partition(":")
  try:
    module = importlib.import_module(module_name)
  except ImportError as exc:  # a writer importing its extra at the top
    if found.extra is None:
      raise
    raise ImportError(f"the {spec} writer needs {exc.name or 'a package'}: "
                      f"{found.hint()}") from exc
  make_writer = getattr(module, function)
  taken = inspect.signature(make_writer).parameters
  options = {key: value for key, value in (
      ("name", name), ("params", params), ("append", append)) if key in taken}
  return lambda: make_writer(run_dir, **options)


def writes_files(spec) -> bool:
  """Whether ``spec`` names a writer that writes files in the run's
  directory."""
  return isinstance(spec, str) and spec in entries() and entries()[spec].files


def import_extra(name: str, module: str) -> types.ModuleType:
  """``module``, which the writer ``name`` needs, imported; an
  ``ImportError`` saying which extra to install if it is missing."""
  try:
    return importlib.import_module(module)
  except ImportError as exc:
    raise ImportError(f"the {name} writer needs {module}: "
                      f"{entries()[name].hint()}") from exc
