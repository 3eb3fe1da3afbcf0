"""The package's import graph keeps the layer order docs/architecture.md
writes: no import up the order, no circle (package ``__init__`` files
included), and no private name used across modules."""

import ast
import pathlib
import re
import sys

import pytest

SRC = pathlib.Path(__file__).parent.parent / "src" / "hostcall"
ARCHITECTURE = pathlib.Path(__file__).parent.parent / "docs" / "architecture.md"

# Lowest first. A module may import from its own layer (without a circle)
# and from the layers below it.
LAYERS = [
    ["hostcall._jax_private"],
    ["hostcall._core", "hostcall._runtime"],
    ["hostcall._derivatives"],
    ["hostcall._flavours"],
    ["hostcall._jit"],
    ["hostcall.host_callback", "hostcall._printing"],
    ["hostcall._apps"],
    ["hostcall", "hostcall.control", "hostcall.metrics", "hostcall.progress",
     "hostcall._notebook"],
    ["hostcall.cli", "hostcall.__main__"],
]


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(SRC.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _imports(name: str) -> list[tuple[str, list[str]]]:
  """``(module, names imported from it)`` for each hostcall import of
  module ``name``, at any depth of its code (functions included)."""
  path = MODULES[name]
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found += [(a.name, []) for a in node.names
                if a.name.split(".")[0] == "hostcall"]
    elif isinstance(node, ast.ImportFrom):
      module = node.module or ""
      if node.level:
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([module] if module else []))
      if module.split(".")[0] != "hostcall":
        continue
      names = [a.name for a in node.names]
      # ``from hostcall._core import calls`` imports a module.
      subs = [n for n in names if f"{module}.{n}" in MODULES]
      found += [(f"{module}.{n}", []) for n in subs]
      rest = [n for n in names if n not in subs]
      if rest:
        found.append((module, rest))
  return found


def _layer(name: str) -> int:
  best = None
  for level, prefixes in enumerate(LAYERS):
    for prefix in prefixes:
      if name == prefix or name.startswith(prefix + "."):
        if best is None or len(prefix) > best[1]:
          best = (level, len(prefix))
  assert best is not None, f"{name} is in no layer: add it to LAYERS and to "
  "docs/architecture.md"
  return best[0]


def _edges():
  return {name: {m for m, _ in _imports(name) if m in MODULES}
          for name in MODULES}


def test_every_module_has_a_layer():
  for name in MODULES:
    _layer(name)


def test_no_import_runs_up_the_layer_order():
  up = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)})"
        for a, targets in _edges().items() for b in targets
        if _layer(b) > _layer(a)]
  assert not up, "\n".join(sorted(up))


def test_no_circle_of_imports():
  edges = _edges()
  state, circles = {}, []

  def visit(node, path):
    state[node] = "open"
    for nxt in sorted(edges[node]):
      if state.get(nxt) == "open":
        circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
      elif nxt not in state:
        visit(nxt, path + [nxt])
    state[node] = "done"

  for node in sorted(edges):
    if node not in state:
      visit(node, [node])
  assert not circles, "\n".join(circles)


def test_no_private_name_is_used_across_modules():
  # ``_jax_private`` is the one module made of JAX's private names, and a
  # package's ``__init__`` may gather its modules' names.
  crossing = []
  for name in MODULES:
    for module, names in _imports(name):
      if module in MODULES and module != name:
        crossing += [f"{name} imports {module}.{n}" for n in names
                     if n.startswith("_") and not n.startswith("__")]
  assert not crossing, "\n".join(sorted(crossing))


def test_the_architecture_page_lists_the_layers_and_every_module():
  text = ARCHITECTURE.read_text()
  for name, path in MODULES.items():
    if path.name == "__init__.py" or name in ("hostcall.__main__",):
      continue
    file_name = path.name
    assert re.search(rf"`[\w/]*{re.escape(file_name)}`", text), (
        f"docs/architecture.md does not name {file_name} ({name})")


def _reaches(name: str, prefix: str) -> list[str]:
  """The modules of package ``name`` that import one of package
  ``prefix``."""
  inside = lambda m, p: m == p or m.startswith(p + ".")
  return sorted(f"{a} imports {b}" for a, targets in _edges().items()
                if inside(a, name) for b in targets if inside(b, prefix))


@pytest.mark.parametrize("application", ["hostcall._apps.progress",
                                         "hostcall._apps.control",
                                         "hostcall._apps.metrics"])
def test_the_loop_engine_imports_no_application(application):
  # Bars and steered loops are listeners of the engine's invocations (and
  # the steering provides the engine's stop check): the engine knows none.
  assert not _reaches("hostcall._apps.loops", application)


@pytest.mark.parametrize("name, other", [
    ("hostcall._apps.control", "hostcall._apps.progress"),
    ("hostcall._apps.progress", "hostcall._apps.control")])
def test_bars_and_steering_do_not_import_each_other(name, other):
  assert not _reaches(name, other)


@pytest.mark.parametrize("graph", ["up", "circle"])
def test_the_checks_catch_what_they_look_for(graph, monkeypatch):
  # The checks themselves fail on a graph that breaks the rules.
  fake = dict(_edges())
  if graph == "up":
    fake["hostcall._runtime.calls"] = fake["hostcall._runtime.calls"] | {
        "hostcall._apps.control"}
    monkeypatch.setattr(sys.modules[__name__], "_edges", lambda: fake)
    with pytest.raises(AssertionError, match="imports hostcall._apps"):
      test_no_import_runs_up_the_layer_order()
  else:
    fake["hostcall._core.targets"] = fake["hostcall._core.targets"] | {
        "hostcall._runtime.calls"}
    fake["hostcall._runtime.calls"] = fake["hostcall._runtime.calls"] | {
        "hostcall._core.targets"}
    monkeypatch.setattr(sys.modules[__name__], "_edges", lambda: fake)
    with pytest.raises(AssertionError, match="->"):
      test_no_circle_of_imports()


TESTS = pathlib.Path(__file__).parent


def _package_of(path: pathlib.Path) -> list[str]:
  """The package a file's relative imports start from (``tests`` for a
  file outside tests/, as the checks' own samples are)."""
  try:
    return list(path.parent.relative_to(TESTS.parent).parts)
  except ValueError:
    return ["tests"]


def _imported_names(node: ast.AST, package: list[str]) -> list[str]:
  """The dotted names an import statement (or an ``import_module`` /
  ``__import__`` call with a constant name) may load: for ``from a import
  b``, both ``a`` and ``a.b`` (``b`` may be a module); a relative one
  resolved from ``package``."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  if isinstance(node, ast.ImportFrom):
    base = node.module or ""
    if node.level:
      above = package[:len(package) - (node.level - 1)]
      base = ".".join(above + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]
  if (isinstance(node, ast.Call) and node.args
      and isinstance(node.args[0], ast.Constant)
      and isinstance(node.args[0].value, str)
      and ast.unparse(node.func).split(".")[-1] in ("import_module",
                                                    "__import__")):
    return [node.args[0].value]
  return []


def _is_test_module(name: str) -> bool:
  """Whether ``name`` is a test module of tests/: ``tests.test_x``,
  ``tests.sub.test_x``, or ``test_x`` as pytest's rootdir import finds it
  (not ``jax._src.test_util``, nor ``tests.helpers``)."""
  parts = name.split(".")
  if parts[0] == "tests":
    parts = parts[1:]
  elif not parts[0].startswith("test_"):
    return False
  return any(part.startswith("test_") for part in parts)


def _test_module_imports(path: pathlib.Path) -> list[str]:
  """The test modules (``test_*``) that the file at ``path`` imports, in
  any form: ``from tests.test_x import``, ``from .test_x import``,
  ``from . import test_x``, ``import test_x``, ``import_module(...)``."""
  package = _package_of(path)
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    names = [n for n in _imported_names(node, package) if _is_test_module(n)]
    if names:
      found.append(names[0])
  return found


def test_no_test_module_imports_another():
  # What several test modules share is in tests/helpers.py (fixtures in
  # conftest.py), never in a test module another one imports.
  offenders = {str(p.relative_to(TESTS)): _test_module_imports(p)
               for p in TESTS.rglob("*.py")}
  assert not {p: i for p, i in offenders.items() if i}


@pytest.mark.parametrize("line, found", [
    ("from tests.test_async import wait_for", "tests.test_async"),
    ("from .test_async import wait_for", "tests.test_async"),
    ("from . import test_async", "tests.test_async"),
    ("from tests import test_async", "tests.test_async"),
    ("from tests.multidevice.test_pmap import f",
     "tests.multidevice.test_pmap"),
    ("import test_async", "test_async"),
    ("import tests.test_async as a", "tests.test_async"),
    ("from test_async import wait_for", "test_async"),
    ("importlib.import_module('tests.test_async')", "tests.test_async"),
    ("__import__('test_async')", "test_async"),
])
def test_the_test_import_check_catches_each_form(tmp_path, line, found):
  path = tmp_path / "test_x.py"
  path.write_text(line + "\n")
  assert _test_module_imports(path) == [found]


@pytest.mark.parametrize("line", [
    "from tests.helpers import wait_for", "from tests import helpers",
    "from . import helpers", "import helpers", "from jax._src import test_util",
    "import jax._src.test_util", "from .conftest import window",
])
def test_the_test_import_check_passes_shared_helpers(tmp_path, line):
  path = tmp_path / "test_x.py"
  path.write_text(line + "\n")
  assert _test_module_imports(path) == []


def _defaulted_getattrs(path: pathlib.Path, names: set) -> list[str]:
  """``getattr(target, "name", default)`` calls in ``path`` (on an object
  its code calls a target) whose name is one of ``names``."""
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id == "getattr" and len(node.args) == 3
        and "target" in ast.unparse(node.args[0])
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in names):
      found.append(f"{path.name}:{node.lineno} {node.args[1].value}")
  return found


def test_no_target_attribute_is_read_with_a_default():
  # Every attribute a target is asked for is declared on HostTarget, with
  # its default there: a getattr with a default would hide a misspelt or
  # undeclared one.
  from hostcall._core.targets import HostTarget
  names = {n for n in dir(HostTarget) if not n.startswith("__")}
  assert not [hit for path in SRC.rglob("*.py")
              for hit in _defaulted_getattrs(path, names)]


def test_the_target_getattr_check_catches_one(tmp_path):
  path = tmp_path / "x.py"
  path.write_text('on = getattr(eqn.params["target"], "loop_event", False)\n'
                  'off = getattr(self.fn, "loop_event", None)\n')
  assert _defaulted_getattrs(path, {"loop_event"}) == ["x.py:1 loop_event"]
