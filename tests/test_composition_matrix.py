"""The composition matrix (issue 39): "a call the user wrote once per step
runs once per step, whatever transformations wrap it".

Every flavour of host call is written once in a tiny body ``f(x) = 2 * x``
and wrapped in two (and, for a selection, three) transformations. How a
cell is built and observed is in ``composition_cells.py``; which cells
there are, what the host receives in each and how that compares with JAX's
own flavour, in the table of ``composition_table.py``, one row a cell. Each
row is a test here. A Hypothesis generator at the end checks the rule
itself on random compositions.

Regenerate the observed side of the table (to review it, never to accept
it blindly) with ``python -m tests.composition_table --observe``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import hypothesis
import pytest
from hypothesis import strategies as st

from tests.composition_cells import N, key, observe
from tests.composition_table import (MULTIDEVICE_ROWS, OPEN_CELLS, ROWS,
                                     SAME, cells, jax_calls,
                                     multidevice_cells)

ROOT = pathlib.Path(__file__).parent.parent


def _params(rows):
  params = []
  for flavour, composition, calls, against in rows:
    k = key(flavour, composition)
    marks = []
    if _heavy(flavour, composition):
      marks.append(pytest.mark.heavy)
    if k in OPEN_CELLS:
      marks.append(pytest.mark.xfail(strict=True, reason=OPEN_CELLS[k]))
    params.append(pytest.param(flavour, composition, calls, against,
                               id=k.replace(" ", "_"), marks=marks))
  return params


def _heavy(flavour, composition) -> bool:
  """The cells run by `make test-compositions` (CI) and `make test-heavy`
  only (`make test` keeps every single transformation for every flavour,
  and every pair for `debug_callback`, the flavour the others' calls are
  made like): pairs with a checkpoint policy other than the default, and
  the other flavours' pairs."""
  if len(composition) < 2:
    return False
  return (any(t.startswith("ckpt_") for t in composition)
          or flavour != "debug_callback")


def test_the_table_covers_every_cell_once():
  for table, wanted in ((ROWS, cells()),
                        (MULTIDEVICE_ROWS, multidevice_cells())):
    rows = [(flavour, composition) for flavour, composition, *_ in table]
    assert len(rows) == len(set(rows))
    assert set(rows) == set(wanted)
  assert set(OPEN_CELLS) <= {key(*cell)
                             for cell in cells() + multidevice_cells()}


@pytest.mark.parametrize("flavour, composition, calls, against",
                         _params(ROWS))
def test_cell(flavour, composition, calls, against, capfd, tmp_path):
  read = (lambda: capfd.readouterr().out) if flavour == "debug_print" else None
  if read:
    read()
  ours = observe(flavour, composition, metrics_root=tmp_path,
                 read_stdout=read)
  if flavour == "pure_callback" and "jvp" in composition:
    # A pure call and its derivative rule's call under jvp are independent
    # (neither reads the other's result): XLA orders them as it likes
    # (0.10 the primal first in a scan step, 0.12 the rule): the same calls.
    assert sorted(ours) == sorted(calls.split()), (
        key(flavour, composition), ours)
    ours = calls.split()
  assert ours == calls.split(), (key(flavour, composition), ours)
  if against == SAME or jax_calls(against) is not None:
    theirs = observe(flavour, composition, jax_flavour=True, read_stdout=read)
    wanted = ours if against == SAME else jax_calls(against)
    if _lanes_in_a_loop(composition):
      # JAX promises no order among the lanes of an unordered callback in
      # a vmapped loop, and its order changed between releases (0.10: the
      # last lane first in a scan; 0.12: in a fori_loop): the same calls.
      theirs, wanted = sorted(theirs), sorted(wanted)
    assert theirs == wanted, theirs


def _lanes_in_a_loop(composition) -> bool:
  if "vmap" not in composition:
    return False
  inner = composition[composition.index("vmap") + 1:]
  return any(t in ("scan", "fori", "while") for t in inner)


@pytest.fixture(scope="module")
def multidevice_observed():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-m", "tests.composition_table",
                         "--multidevice"], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("flavour, composition, calls, against",
                         _params(MULTIDEVICE_ROWS))
def test_multidevice_cell(flavour, composition, calls, against,
                          multidevice_observed):
  assert multidevice_observed[key(flavour, composition)] == calls.split()


# --- the rule, on random compositions -----------------------------------------

GENERATED = ["jit", "vmap", "grad", "scan", "fori", "cond", "ckpt",
             "ckpt_nothing", "ckpt_dots"]
LOOPS = {"scan": N, "fori": N}


def calls_per_primal_step(composition) -> int | None:
  """How many times a ``debug_callback`` written once in the body runs:
  once per primal step (loops multiply, ``vmap`` calls once per element),
  whatever ``jit``, ``grad`` and ``cond`` (a taken branch) wrap it. None
  where a ``jax.checkpoint`` is differentiated: there the promise is "as
  ``jax.debug.callback``" (it may run again where rematerialised)."""
  count = 1
  for i, name in enumerate(composition):
    if name.startswith("ckpt") and "grad" in composition[:i]:
      return None
    count *= LOOPS.get(name, 2 if name == "vmap" else 1)
  return count


def the_rule_holds(composition):
  ours = observe("debug_callback", composition)
  assert not any(e.startswith("!") for e in ours), (composition, ours)
  expected = calls_per_primal_step(composition)
  if expected is None:
    theirs = observe("debug_callback", composition, jax_flavour=True)
    assert sorted(ours) == sorted(theirs), (composition, ours, theirs)
  else:
    assert len(ours) == expected, (composition, ours)


_compositions = st.lists(st.sampled_from(GENERATED), min_size=2, max_size=3)


def _settings(examples):
  return hypothesis.settings(max_examples=examples, deadline=None,
                             derandomize=True,
                             suppress_health_check=list(
                                 hypothesis.HealthCheck))


test_a_call_runs_once_per_primal_step = _settings(25)(
    hypothesis.given(_compositions)(the_rule_holds))
test_a_call_runs_once_per_primal_step_at_length = pytest.mark.heavy(
    _settings(400)(hypothesis.given(_compositions)(the_rule_holds)))
