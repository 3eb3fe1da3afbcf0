"""The Python snippets in README.md and docs/*.md run."""

import importlib.util
import os
import pathlib
import re

import pytest

import hostcall

ROOT = pathlib.Path(__file__).parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [(doc.name, i, code) for doc in DOCS
            for i, code in enumerate(re.findall(r"```python\n(.*?)```",
                                                doc.read_text(), re.S))]


@pytest.mark.parametrize("name,index,code", SNIPPETS,
                         ids=[f"{n}#{i}" for n, i, _ in SNIPPETS])
def test_snippet_runs(name, index, code, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # snippets that log write runs/ here
  environment = dict(os.environ)  # snippets set MLFLOW_TRACKING_URI, ...
  try:
    # Fails if the snippet raises, or if a callback it started raised.
    try:
      exec(compile(code, f"{name}#{index}", "exec"), {})
    except ImportError as exc:
      missing = [extra for extra, module in _EXTRAS.items()
                 if module == exc.name or f"hostcall[{extra}]" in str(exc)]
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


def test_readme_example_prints_what_it_says(capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(),
                    re.S)[0]
  exec(compile(code, "README.md#0", "exec"), {})
  hostcall.barrier()
  expected = [line[2:] for line in code.splitlines() if line.startswith("# ")]
  assert capsys.readouterr().out.splitlines() == expected
