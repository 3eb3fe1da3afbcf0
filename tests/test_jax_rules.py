"""What importing hostcall changes of JAX is exactly what
``hostcall._core.jax_rules`` lists (``REPLACED``), and nothing else
installs it.

In a fresh interpreter, JAX's modules that hostcall's import loads are
imported first; then every rule table (a mapping keyed by primitives, one
level of nesting: per-platform lowerings), every registry (a set of
primitives, classes or effect types) and every function of those modules
and method of their classes is recorded, hostcall imported, and recorded
again. An entry changed, or added for anything not hostcall's own (its
primitives, its classes), must be listed; every listed entry this JAX has
must have changed.
"""

import ast
import json
import pathlib

from tests.helpers import run_python

SRC = pathlib.Path(__file__).parent.parent / "src" / "hostcall"

_SNAPSHOT = r'''
import collections.abc, importlib, inspect, json, sys

def jax_modules():
  return sorted(n for n, m in list(sys.modules.items()) if m is not None
                and (n == "jax" or n.startswith(("jax.", "jaxlib."))))

if sys.argv[1] == "modules":
  import hostcall
  print(json.dumps(jax_modules()))
  raise SystemExit

for name in json.loads(sys.argv[1]):
  try:
    importlib.import_module(name)
  except Exception:
    pass
from jax._src.core import Primitive
from jax._src.effects import EffectTypeSet

def key_name(k):
  if isinstance(k, Primitive):
    return k.name
  if inspect.isclass(k):
    return k.__name__
  return None

def entries(table):
  """(key name, key, value) of a table or registry's entries, or None."""
  if isinstance(table, EffectTypeSet):
    return [(t.__name__, t, t) for t in table._effect_types]
  if isinstance(table, (set, frozenset)):
    found = [(key_name(k), k, k) for k in table]
    return [e for e in found if e[0] is not None] or None
  if isinstance(table, collections.abc.Mapping):
    try:
      items = list(table.items())
    except Exception:
      return None
    found = [(key_name(k), k, v) for k, v in items]
    return [e for e in found if e[0] is not None] or None
  return None

def snapshot():
  out, seen = {}, set()
  for name in jax_modules():  # jax._src's first: a table is named by it
    module = sys.modules[name]
    for attr, value in list(vars(module).items()):
      if id(value) in seen:
        continue  # the same table re-exported (jax.interpreters)
      table = entries(value)
      if table is not None or isinstance(value, collections.abc.Mapping):
        seen.add(id(value))
      if table is not None:
        for k_name, k, v in table:
          out[(name, attr, k_name, id(k))] = (v, k)
        continue
      if isinstance(value, collections.abc.Mapping):
        for platform, inner in list(value.items()):
          table = entries(inner) if isinstance(platform, str) else None
          for k_name, k, v in table or ():
            out[(name, f"{attr}[{platform}]", k_name, id(k))] = (v, k)
        continue
      if inspect.isclass(value) and value.__module__ == name:
        for a, v in list(vars(value).items()):
          if callable(v) or isinstance(v, (staticmethod, classmethod,
                                           property)):
            out[(name, f"{value.__name__}.{a}", None, 0)] = (v, None)
      elif inspect.isfunction(value):
        out[(name, attr, None, 0)] = (value, None)
  return out

def owned(k):
  if isinstance(k, Primitive):
    return k.name.startswith("hostcall")
  return getattr(k, "__module__", "").startswith("hostcall")

before = snapshot()
import hostcall
from hostcall._core import jax_rules
after = snapshot()
changed = sorted({key[:3] for key, (v, _) in after.items()
                  if key in before and before[key][0] is not v})
added = sorted({key[:3] for key, (v, k) in after.items()
                if key not in before and not owned(k)})
removed = sorted({key[:3] for key in before if key not in after})
def has(module, name, key):
  """Whether this JAX has the listed entry (before or after)."""
  module = sys.modules.get(module)
  if module is None:
    return False
  if "." in name:
    cls, attr = name.split(".")
    return attr in vars(getattr(module, cls, object))
  return hasattr(module, name) and (key is None or any(
      k[:3] == (module.__name__, name, key) for k in [*before, *after]))
listed_here = sorted({tuple(e) for e in jax_rules.REPLACED if has(*e)})
print(json.dumps({"changed": changed, "added": added, "removed": removed,
                  "listed_here": listed_here,
                  "listed": [list(e) for e in jax_rules.REPLACED]}))
'''


def _diff():
  modules = run_python(
      f"import sys; sys.argv = ['', 'modules']\n{_SNAPSHOT}",
      timeout=300).stdout.strip().splitlines()[-1]
  out = run_python(
      f"import sys; sys.argv = ['', {modules!r}]\n{_SNAPSHOT}",
      timeout=300).stdout.strip().splitlines()[-1]
  return {k: [tuple(e) for e in v] for k, v in json.loads(out).items()}


def test_importing_hostcall_changes_exactly_the_listed_jax_rules():
  diff = _diff()
  listed = set(diff["listed"])
  unlisted = sorted((set(diff["changed"]) | set(diff["added"])) - listed)
  assert not unlisted, (
      "importing hostcall changed JAX's rules not listed in "
      f"hostcall._core.jax_rules.REPLACED (nor its docstring): {unlisted}")
  assert not diff["removed"], diff["removed"]
  # Every listed entry this JAX has was replaced (the two remat entries:
  # whichever of them this release has).
  unchanged = sorted(set(diff["listed_here"]) - set(diff["changed"])
                     - set(diff["added"]))
  assert not unchanged, f"listed but not replaced: {unchanged}"
  assert set(diff["changed"]) | set(diff["added"]) == set(
      diff["listed_here"])


def test_every_listed_replacement_is_in_the_docstring_table():
  from hostcall._core import jax_rules
  doc = jax_rules.__doc__.replace("\n", " ")
  for module, name, key in jax_rules.REPLACED:
    table = name.split(".")[-1] if "." in name else name
    assert table.lstrip("_") in doc.replace("``", ""), (module, name)
    if key is not None:
      assert key in doc, (module, name, key)


# Where a JAX rule is replaced: the helpers of _jax_private that replace
# one, and JAX's own primitives' tables. Called from jax_rules only.
_INSTALLERS = {"keep_io_in_partial_evaluation", "keep_calls_in_loop_bodies",
               "restage_while_without", "explain_checkpoint_refusal",
               "start_ordered_effects_afresh_after_a_failure"}
_JAX_PRIMITIVES = {"while_p", "cond_p", "scan_p", "remat_p", "pjit_p",
                   "jit_p", "closed_call_p"}


def test_only_jax_rules_installs_a_replacement():
  offenders = []
  for path in SRC.rglob("*.py"):
    if "_jax_private" in path.parts or path.name == "jax_rules.py":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Call)
          and isinstance(node.func, ast.Attribute)
          and node.func.attr in _INSTALLERS):
        offenders.append(f"{path.relative_to(SRC)}:{node.lineno} calls "
                         f"{node.func.attr}")
      targets = (node.targets if isinstance(node, ast.Assign) else [])
      for target in targets:
        if (isinstance(target, ast.Subscript)
            and isinstance(target.slice, ast.Attribute)
            and target.slice.attr in _JAX_PRIMITIVES):
          offenders.append(f"{path.relative_to(SRC)}:{node.lineno} "
                           f"replaces the rule of {target.slice.attr}")
  assert not offenders, "\n".join(offenders)
