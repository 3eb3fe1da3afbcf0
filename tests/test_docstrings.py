"""Every example in hostcall's docstrings runs and prints what it shows."""

import doctest
import importlib
import importlib.util
import os
import pkgutil

import pytest

import hostcall

MODULES = sorted(m.name for m in pkgutil.walk_packages(hostcall.__path__,
                                                       "hostcall.")
                 if m.name != "hostcall.__main__")


#: Modules whose examples need an extra's package: skipped without it.
NEEDS = {"hostcall._apps.metrics.mlflow": ("mlflow", "mlflow"),
         "hostcall._apps.metrics.wandb": ("wandb", "wandb")}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
  if name in NEEDS and importlib.util.find_spec(NEEDS[name][1]) is None:
    pytest.skip(f"its examples need pip install 'hostcall[{NEEDS[name][0]}]'")
  monkeypatch.chdir(tmp_path)  # examples that write runs/ write them here
  environment = dict(os.environ)  # examples set WANDB_MODE, ...
  try:
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        report=True)
  finally:
    os.environ.clear()
    os.environ.update(environment)
  assert result.failed == 0, f"{result.failed} docstring examples failed"
