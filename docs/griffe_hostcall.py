"""A griffe extension for hostcall's API pages (loaded by mkdocs.yml).

hostcall's docstrings are Google style with two habits that griffe's Google
parser does not read as meant; this extension adapts the text when griffe
loads it, without touching the sources:

* ``Example:`` (singular) opens the examples: griffe knows only
  ``Examples:``, and would render the doctest as prose.
* In ``Arguments:`` several names may share one description and their list
  may wrap (``result, tap_with_device, ...,`` then ``partitioned: as for
  id_tap``): the wrapped names are joined onto one line.
* ``#:`` comments above a module attribute (``TapFunctionException``)
  document it, as Sphinx reads them.
"""

from __future__ import annotations

import re

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)
# A line of parameter names ending with a comma, continued by the next line.
_WRAPPED_NAMES = re.compile(r"^(\s+[\w*]+(?:, [\w*]+)*,)\n\s+(?=[\w*]+[,:])",
                            re.M)


class HostcallDocstrings(griffe.Extension):
  """Adapts hostcall's docstrings to griffe's Google parser."""

  def on_instance(self, *, node, obj, agent, **kwargs) -> None:
    del node, agent, kwargs
    if obj.docstring is None:
      if obj.is_attribute:
        comment = _sphinx_comment(obj)
        if comment:
          obj.docstring = griffe.Docstring(comment, parent=obj)
      return
    text = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)
    text = _WRAPPED_NAMES.sub(r"\1 ", text)
    obj.docstring.value = text


def _sphinx_comment(obj) -> str | None:
  """The ``#:`` comment lines right above ``obj``'s assignment."""
  if not obj.lineno or obj.filepath is None or isinstance(obj.filepath, list):
    return None
  try:
    lines = obj.lines_collection[obj.filepath]
  except KeyError:
    return None
  comment, index = [], obj.lineno - 2
  while index >= 0 and lines[index].lstrip().startswith("#:"):
    comment.insert(0, lines[index].lstrip()[2:].strip())
    index -= 1
  return " ".join(comment) or None
