"""docs/compatibility.md's table is what the probes find today."""

import pathlib

from tests import compatibility_probes

DOC = pathlib.Path(__file__).parent.parent / "docs" / "compatibility.md"


def test_compatibility_table_matches_the_code():
  text = DOC.read_text()
  documented = text.split("<!-- table:begin -->\n")[1].split(
      "<!-- table:end -->")[0].strip()
  assert documented == compatibility_probes.table().strip(), (
      "docs/compatibility.md is stale: regenerate it with "
      "`.venv/bin/python -m tests.compatibility_probes`")
