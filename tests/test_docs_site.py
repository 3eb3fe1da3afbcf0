"""The documentation site (mkdocs.yml) builds in strict mode and its API
pages document every public name (tests/test_docs.py runs every page's
Python blocks)."""

import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest


ROOT = pathlib.Path(__file__).parent.parent
PAGES = ["index.md", "getting-started.md", "migration.md", "native.md"]
PUBLIC_MODULES = ["hostcall", "hostcall.host_callback", "hostcall.progress",
                  "hostcall.metrics", "hostcall.control"]


def public_names() -> list[str]:
  """Every name the API pages must document: the five ``__all__``s, and the
  public methods and properties of every public class among them."""
  names = []
  for module_name in PUBLIC_MODULES:
    module = importlib.import_module(module_name)
    for name in module.__all__:
      names.append(f"{module_name}.{name}")
      value = getattr(module, name)
      if inspect.isclass(value):
        names += [f"{module_name}.{name}.{member}"
                  for member, attr in vars(value).items()
                  if not member.startswith("_") and (
                      inspect.isfunction(attr) or
                      isinstance(attr, (property, classmethod, staticmethod)))]
  return names


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  out = tmp_path_factory.mktemp("site")
  try:
    import mkdocs  # noqa: F401
  except ImportError:
    pytest.fail("mkdocs is not installed: pip install -e '.[test]' (or "
                "'.[docs]')")
  proc = subprocess.run(
      [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
       str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
  assert proc.returncode == 0, (
      f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}"
      f"{proc.stderr[-8000:]}")
  return out


def test_site_builds_in_strict_mode(site):
  for page in PAGES + ["flavours.md", "compatibility.md", "applications.md",
                       "distributed.md", "reliability.md", "performance.md"]:
    assert (site / page.replace(".md", ".html")).exists(), page


def test_api_pages_document_every_public_name(site):
  ids = set()
  for page in (site / "api").glob("*.html"):
    ids |= set(re.findall(r'id="(hostcall[\w.]*)"', page.read_text()))
  missing = [name for name in public_names() if name not in ids]
  assert not missing, (
      f"not documented on the API pages (docs/api/*.md): {missing}. Add a "
      "`::: name` block, or a docstring to a method (members without one "
      "are not shown).")


def test_public_names_include_the_writer_interface():
  names = public_names()
  for method in ("write", "flush", "close"):
    assert f"hostcall.metrics.Writer.{method}" in names


def test_a_returns_section_is_one_item_and_no_rest_markup_shows(site):
  # griffe's Google parser makes each line of "Returns:" a row typed Any
  # unless told otherwise (mkdocs.yml: returns_multiple_items: false).
  for page in (site / "api").glob("*.html"):
    text = page.read_text()
    assert "::</p>" not in text and ":: " not in re.sub(r"<[^>]+>", "", text), page.name
  progress = (site / "api" / "progress.html").read_text()
  scan = progress[progress.index('id="hostcall.progress.scan"'):
                  progress.index('id="hostcall.progress.fori_loop"')]
  returns = scan[scan.index("Returns:"):]
  returns = returns[:returns.index("</table>")]
  assert returns.count('class="doc-section-item"') == 1, returns
  assert "ys</code> rows of the steps not run are zeros" in returns
