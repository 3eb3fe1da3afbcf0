"""The Python snippets in README.md and docs/*.md run."""

import importlib.util
import os
import pathlib
import re
import sys
import tomllib

import pytest

import hostcall

ROOT = pathlib.Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [(doc.name, i, code) for doc in DOCS
            for i, code in enumerate(re.findall(r"```python\n(.*?)```",
                                                doc.read_text(), re.S))]


#: The optional packages (pyproject.toml's extras) and their modules.
_OPTIONAL = {"scipy": "scipy", "matplotlib": "matplotlib", "pandas": "pandas",
             "tensorboardX": "tensorboardX", "mlflow-skinny": "mlflow",
             "wandb": "wandb", "ipywidgets": "ipywidgets"}


def venv_of(page: str, code: str) -> str | None:
  """The extras of the venv a snippet runs in, comma-separated: its page's
  (``<!-- venv: demo -->``, the venv ``make demo`` makes) and those it
  names in a comment of its own (``# pip install 'hostcall[mlflow]'``);
  None where its page names none (the test venv, every extra)."""
  page_text = (ROOT / page if page == "README.md" else
               ROOT / "docs" / page).read_text()
  named = re.search(r"<!-- venv: ([\w,]+) -->", page_text)
  if named is None:
    return None
  own = re.findall(r"#.*pip install 'hostcall\[([\w,]+)\]'", code)
  return ",".join([named.group(1), *own])


def hide_missing_extras(venv: str | None, monkeypatch) -> set[str]:
  """Makes the optional packages that ``venv``'s extras do not install
  unimportable (as in that venv) until the test ends; returns their
  modules."""
  if venv is None:
    return set()
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())[
      "project"]["optional-dependencies"]
  installed = {re.split(r"[<>=\[ ]", requirement)[0]
               for extra in venv.split(",") for requirement in extras[extra]}
  hidden = {module for package, module in _OPTIONAL.items()
            if package not in installed}
  for module in hidden:
    monkeypatch.setitem(sys.modules, module, None)
  return hidden


def test_pages_name_venvs_that_exist():
  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())[
      "project"]["optional-dependencies"]
  named = {name: venv_of(name, code) for name, _, code in SNIPPETS}
  for page in ("README.md", "index.md", "getting-started.md",
               "applications.md"):  # the first hour's, and the metrics'
    assert named[page].split(",")[0] == "demo", page
  # Every page with Python blocks says where they run (issue 54).
  unnamed = sorted(name for name, venv in named.items() if venv is None)
  assert not unnamed, (f"{unnamed} name no venv for their Python blocks: "
                       "add <!-- venv: demo --> and say so on the page")
  for name, venv in named.items():
    assert venv is None or set(venv.split(",")) <= set(extras), name


@pytest.mark.parametrize("name,index,code", SNIPPETS,
                         ids=[f"{n}#{i}" for n, i, _ in SNIPPETS])
def test_snippet_runs(name, index, code, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # snippets that log write runs/ here
  hidden = hide_missing_extras(venv_of(name, code), monkeypatch)
  environment = dict(os.environ)  # snippets set MLFLOW_TRACKING_URI, ...
  try:
    # Fails if the snippet raises, or if a callback it started raised.
    try:
      exec(compile(code, f"{name}#{index}", "exec"), {})
    except ImportError as exc:
      missing = [extra for extra, module in _EXTRAS.items()
                 if module == exc.name or f"hostcall[{extra}]" in str(exc)]
      if missing and _EXTRAS[missing[0]] in hidden:
        pytest.fail(f"{name}#{index} needs hostcall[{missing[0]}], which "
                    f"the venv its page names lacks: say so in the block "
                    f"(# pip install 'hostcall[{missing[0]}]').")
      if missing and importlib.util.find_spec(_EXTRAS[missing[0]]) is None:
        pytest.skip(f"the snippet needs pip install "
                    f"'hostcall[{missing[0]}]'")
      raise
    hostcall.barrier()
  finally:
    os.environ.clear()
    os.environ.update(environment)


#: The extras whose packages a snippet may need, and their modules: without
#: them (a venv made before they were extras) the snippet is skipped.
_EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}


def shown_output(code: str) -> list[str] | None:
  """What a snippet says it prints: each ``# prints: TEXT`` comment (on its
  own line or after code), and the ``#         TEXT`` lines right under it
  (aligned under the first line's text); None if it says nothing."""
  lines, expected, shown = code.splitlines(), [], False
  for i, line in enumerate(lines):
    marker = line.find("# prints: ")
    if marker >= 0:
      shown = True
      expected.append(line[marker + len("# prints: "):].rstrip())
      for more in lines[i + 1:]:
        stripped = more.lstrip()
        if not stripped.startswith("#" + " " * 9):
          break
        expected.append(stripped[10:].rstrip())
  return expected if shown else None


SHOWN = [(name, index, code, shown_output(code))
         for name, index, code in SNIPPETS if shown_output(code) is not None]


def test_the_readme_shows_output():
  assert [n for n, *_ in SHOWN].count("README.md") >= 3


@pytest.mark.parametrize("name,index,code,expected", SHOWN,
                         ids=[f"{n}#{i}" for n, i, *_ in SHOWN])
def test_snippet_prints_what_it_says(name, index, code, expected, capsys,
                                     tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  hide_missing_extras(venv_of(name, code), monkeypatch)
  exec(compile(code, f"{name}#{index}", "exec"), {})
  hostcall.barrier()
  assert capsys.readouterr().out.splitlines() == expected


def _resolve(name: str):
  import importlib
  parts = name.split(".")
  obj = importlib.import_module(parts[0])
  for i, part in enumerate(parts[1:], 1):
    obj = (getattr(obj, part) if hasattr(obj, part)
           else importlib.import_module(".".join(parts[:i + 1])))
  return obj


def test_every_hostcall_name_the_docs_write_exists():
  names = {(doc.name, name) for doc in DOCS + sorted((ROOT / "docs" / "api")
                                                     .glob("*.md"))
           for code in re.findall(r"`([^`\n]+)`", doc.read_text())
           for name in re.findall(r"(?<![\w.])hostcall(?:\.[A-Za-z_]\w*)+",
                                  code)}
  assert len(names) > 100
  missing = []
  for doc, name in sorted(names):
    try:
      _resolve(name)
    except (AttributeError, ImportError):
      missing.append((doc, name))
  assert missing == []


def test_the_readme_leads_to_getting_started_and_migration():
  readme = (ROOT / "README.md").read_text()
  assert "(docs/getting-started.md)" in readme
  assert "(docs/migration.md)" in readme


def test_the_migration_guides_renames_exist():
  text = (ROOT / "docs" / "migration.md").read_text()
  rows = re.findall(r"^\| `(jax\.[\w.]+)` \| `(hostcall\.[\w.]+)` \|$", text,
                    re.M)
  assert len(rows) == 4
  for jax_name, hostcall_name in rows:
    _resolve(jax_name), _resolve(hostcall_name)
  assert ("jax.debug.callback", "hostcall.debug_callback") in rows


def test_the_api_index_names_every_public_name():
  import importlib
  import types
  index = (ROOT / "docs" / "api" / "index.md").read_text()
  submodules = [name for name in hostcall.__all__
                if isinstance(getattr(hostcall, name), types.ModuleType)]
  words = {3: "three", 4: "four", 5: "five", 6: "six"}
  assert f"{words[len(submodules)]} public submodules" in index
  missing = [f"hostcall.{name}" for name in hostcall.__all__
             if f"`hostcall.{name}`" not in index
             and f"[hostcall.{name}]" not in index]
  for module_name in submodules:
    module = importlib.import_module(f"hostcall.{module_name}")
    row, = [line for line in index.splitlines()
            if line.startswith(f"| [hostcall.{module_name}]")]
    missing += [f"hostcall.{module_name}.{name}" for name in module.__all__
                if f"`{name}`" not in row]
  assert missing == []
