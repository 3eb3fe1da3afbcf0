"""Every example in hostcall's docstrings runs and prints what it shows."""

import doctest
import importlib
import pkgutil

import pytest

import hostcall

MODULES = sorted(m.name for m in pkgutil.walk_packages(hostcall.__path__,
                                                       "hostcall.")
                 if m.name != "hostcall.__main__")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # examples that write runs/ write them here
  module = importlib.import_module(name)
  result = doctest.testmod(
      module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
      report=True)
  assert result.failed == 0, f"{result.failed} docstring examples failed"
