"""``vmap`` of a ``while_loop`` whose predicate is batched: a call in the
body runs for the lanes still looping (issue 52, JAX #20628).

JAX batches such a loop by running its body for every lane while any
lane's predicate holds and keeping the old carry of the lanes that have
finished: ``jax.debug.callback`` there runs for those lanes too, with
their last values again. hostcall's gatable calls (``debug_callback``,
``debug_print``, a result-less ``io_callback``) run only for the lanes
whose predicate still holds (``hostcall._core.gating``); JAX's own
callbacks, with hostcall imported, still run as JAX runs them, which each
row asserts in the same process.
"""

from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hostcall
from hostcall import host_callback as hcb


def _values(*vs):
  return tuple(np.asarray(v).tolist() for v in vs)


class Calls:
  """What the host functions saw: ``(tag, *values)`` in arrival order."""

  def __init__(self):
    self.seen = []

  def hostcall(self, tag, *values, **options):
    hostcall.debug_callback(
        lambda *v: self.seen.append((tag, *_values(*v))), *values, **options)

  def jax(self, tag, *values, **options):
    jax.debug.callback(
        lambda *v: self.seen.append((tag, *_values(*v))), *values, **options)


def _count_up(n, call, tag="b"):
  def body(i):
    call(tag, n, i)
    return i + 1
  return lax.while_loop(lambda i: i < n, body, 0)


def _nested(n, m, call):
  def outer(c):
    i, acc = c

    def inner(d):
      j, a = d
      call("in", n, m, i, j)
      return j + 1, a + 1
    _, acc = lax.while_loop(lambda d: d[0] < m, inner, (0, acc))
    call("out", n, i)
    return i + 1, acc
  return lax.while_loop(lambda c: c[0] < n, outer, (0, 0))[1]


def _cond_in_body(n, call):
  def body(i):
    lax.cond(i % 2 == 0, lambda: call("even", n, i), lambda: None)
    return i + 1
  return lax.while_loop(lambda i: i < n, body, 0)


def _called_in_condition(n, call, ordered):
  def cond(i):
    call("c", n, i, ordered=ordered)
    return i < n
  return lax.while_loop(cond, lambda i: (call("b", n, i), i + 1)[1], 0)


def _unbatched_predicate(x, call):
  return lax.while_loop(
      lambda c: c[0] < 2,
      lambda c: (call("u", c[0], c[1]), (c[0] + 1, c[1] * 2))[1], (0, x))[1]


def _inner_unbatched(n, xs, call):
  def f(x):
    return lax.while_loop(
        lambda c: c[0] < n,
        lambda c: (call("v", n, x, c[0]), (c[0] + 1, c[1] + x))[1], (0, x))[1]
  return jax.vmap(f)(xs)


N = jnp.array([1, 3])
FINISHED_AT_1 = [("b", 1, 0), ("b", 3, 0), ("b", 3, 1), ("b", 3, 2)]

# name: (program(call, *args), args, hostcall's calls, JAX's calls ("=": the
# same)), each list sorted (unordered calls arrive in any order); every
# program runs under jax.jit(jax.vmap(...)).
CASES = {
    "while_loop": (
        _count_up, (N,), FINISHED_AT_1,
        # JAX #20628: lane 0 finished after one step, called twice more
        sorted(FINISHED_AT_1 + [("b", 1, 1), ("b", 1, 1)])),
    "fori_loop with a batched bound (a while_loop)": (
        lambda n, call: lax.fori_loop(
            0, n, lambda i, c: (call("b", n, i), c + 1)[1], 0),
        (N,), FINISHED_AT_1,
        sorted(FINISHED_AT_1 + [("b", 1, 1), ("b", 1, 1)])),
    "fori_loop with static bounds (a scan: nothing to gate)": (
        lambda x, call: lax.fori_loop(
            0, 2, lambda i, c: (call("s", i, c), c + x)[1], x),
        (N,), [("s", 0, 1), ("s", 0, 3), ("s", 1, 2), ("s", 1, 6)], "="),
    "an unbatched predicate (nothing to gate)": (
        _unbatched_predicate, (jnp.array([1.0, 5.0]),),
        [("u", 0, 1.0), ("u", 0, 5.0), ("u", 1, 2.0), ("u", 1, 10.0)], "="),
    "while_loop in while_loop": (
        _nested, (jnp.array([1, 2]), jnp.array([2, 1])),
        [("in", 1, 2, 0, 0), ("in", 1, 2, 0, 1), ("in", 2, 1, 0, 0),
         ("in", 2, 1, 1, 0), ("out", 1, 0), ("out", 2, 0), ("out", 2, 1)],
        [("in", 1, 2, 0, 0), ("in", 1, 2, 0, 1), ("in", 1, 2, 1, 0),
         ("in", 1, 2, 1, 1), ("in", 2, 1, 0, 0), ("in", 2, 1, 0, 1),
         ("in", 2, 1, 1, 0), ("in", 2, 1, 1, 1), ("out", 1, 0),
         ("out", 1, 1), ("out", 2, 0), ("out", 2, 1)]),
    "while_loop in a cond's branch": (
        lambda p, n, call: lax.cond(p, lambda n: _count_up(n, call),
                                    lambda n: -1, n),
        (jnp.array([True, False, True]), jnp.array([1, 3, 2])),
        [("b", 1, 0), ("b", 2, 0), ("b", 2, 1)],
        [("b", 1, 0), ("b", 1, 1), ("b", 1, 1), ("b", 2, 0), ("b", 2, 1),
         ("b", 2, 2), ("b", 3, 0), ("b", 3, 1), ("b", 3, 2)]),
    "a cond in the body": (
        # JAX's cond under vmap calls for every lane (#19314), and lane 0,
        # stopped at i = 2, twice more
        _cond_in_body, (jnp.array([2, 5]),),
        [("even", 2, 0), ("even", 5, 0), ("even", 5, 2), ("even", 5, 4)],
        [("even", 2, 0), ("even", 2, 1), ("even", 2, 2), ("even", 2, 2),
         ("even", 2, 2), ("even", 5, 0), ("even", 5, 1), ("even", 5, 2),
         ("even", 5, 3), ("even", 5, 4)]),
    "a call in the condition too (run as JAX runs it)": (
        lambda n, call: _called_in_condition(n, call, False), (N,),
        sorted(FINISHED_AT_1 + [("c", 1, 0)] * 2 + [("c", 1, 1)] * 5
               + [("c", 3, i) for i in (0, 0, 1, 1, 2, 2, 3)]),
        sorted(FINISHED_AT_1 + [("b", 1, 1), ("b", 1, 1)] + [("c", 1, 0)] * 2
               + [("c", 1, 1)] * 5
               + [("c", 3, i) for i in (0, 0, 1, 1, 2, 2, 3)])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_call_in_the_body_runs_for_the_lanes_still_looping(name):
  program, args, ours, theirs = CASES[name]
  results = {}
  for flavour in ("hostcall", "jax"):
    calls = Calls()
    f = jax.jit(jax.vmap(lambda *a: program(*a, getattr(calls, flavour))))
    results[flavour] = np.asarray(f(*args))
    jax.effects_barrier()
    hostcall.barrier()
    assert sorted(calls.seen) == (ours if flavour == "hostcall" or theirs
                                  == "=" else theirs), flavour
  # The loop's results are JAX's, whichever calls it makes.
  np.testing.assert_array_equal(results["hostcall"], results["jax"])


def test_nested_vmaps_gate_each_lane():
  # Both levels batch the predicate: the gate of the inner vmap is batched
  # by the outer one, lane by lane; and an unbatched inner predicate, which
  # the outer vmap batches.
  calls = Calls()
  out = jax.jit(jax.vmap(jax.vmap(lambda n: _count_up(n, calls.hostcall))))(
      jnp.array([[1, 3], [0, 2]]))
  hostcall.barrier()
  np.testing.assert_array_equal(out, [[1, 3], [0, 2]])
  assert sorted(calls.seen) == sorted(
      FINISHED_AT_1 + [("b", 2, 0), ("b", 2, 1)])
  calls.seen.clear()
  out = jax.jit(jax.vmap(lambda n, xs: _inner_unbatched(n, xs,
                                                        calls.hostcall)))(
      jnp.array([1, 2]), jnp.array([[10, 20], [30, 40]]))
  hostcall.barrier()
  np.testing.assert_array_equal(out, [[20, 40], [90, 120]])
  assert sorted(calls.seen) == [("v", 1, 10, 0), ("v", 1, 20, 0),
                                ("v", 2, 30, 0), ("v", 2, 30, 1),
                                ("v", 2, 40, 0), ("v", 2, 40, 1)]


def test_ordered_calls_keep_their_order():
  # Step by step, lanes in index order; and with an ordered call in the
  # condition (its predicate carried, as before), the body still gated.
  calls = Calls()
  jax.jit(jax.vmap(lambda n: _count_up(
      n, lambda *a: calls.hostcall(*a, ordered=True))))(N)
  hostcall.barrier()
  assert calls.seen == FINISHED_AT_1
  calls.seen.clear()
  out = jax.jit(jax.vmap(lambda n: _called_in_condition(
      n, lambda *a, ordered=True: calls.hostcall(*a, ordered=ordered),
      True)))(N)
  hostcall.barrier()
  np.testing.assert_array_equal(out, [1, 3])
  assert [c for c in calls.seen if c[0] == "b"] == FINISHED_AT_1
  # The condition's ordered calls: before the loop and after each step,
  # for every lane, as before.
  assert len([c for c in calls.seen if c[0] == "c"]) == 2 * 4


def _loop_of(call):
  return lambda n: lax.while_loop(lambda i: i < n,
                                  lambda i: (call(n, i), i + 1)[1], 0)


def _record(seen):
  return lambda *v: seen.append(_values(*v))


_INT = jax.ShapeDtypeStruct((), jnp.int32)

# flavour: (the call, given the list the host appends to; what the host
# sees; the error, if refused), for the loop of lanes ending at 1 and 3.
FLAVOURS = {
    "debug_callback": (
        lambda seen: lambda n, i: hostcall.debug_callback(_record(seen), n, i),
        [(1, 0), (3, 0), (3, 1), (3, 2)], None),
    "io_callback": (  # JAX refuses its own io callback there
        lambda seen: lambda n, i: hostcall.io_callback(_record(seen), None, n,
                                                       i),
        [(1, 0), (3, 0), (3, 1), (3, 2)], None),
    "io_callback, vectorised": (  # the whole batch, while any lane loops
        lambda seen: lambda n, i: hostcall.io_callback(
            _record(seen), None, n, i, vmap_method="expand_dims"),
        [([1, 3], [0, 0]), ([1, 3], [1, 1]), ([1, 3], [1, 2])], None),
    "id_tap (the legacy module showed the whole batch)": (
        lambda seen: lambda n, i: hcb.id_tap(
            lambda v, _: seen.append(_values(*v)), (n, i)),
        [([1, 3], [0, 0]), ([1, 3], [1, 1]), ([1, 3], [1, 2])], None),
    "pure_callback (a result: every lane, as jax.pure_callback)": (
        lambda seen: lambda n, i: hostcall.pure_callback(
            lambda n, i: (seen.append(_values(n, i)), i)[1], _INT, n, i,
            vmap_method="sequential"),
        [(1, 0), (1, 1), (1, 1), (3, 0), (3, 1), (3, 2)], None),
    "io_callback with a result (refused, as JAX refuses it)": (
        lambda seen: lambda n, i: hostcall.io_callback(
            lambda n, i: (seen.append(1), i)[1], _INT, n, i),
        [], "IO effects not supported in while_loop with batched predicate"),
}


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_what_each_flavour_sees_in_the_body(flavour):
  make, expected, refused = FLAVOURS[flavour]
  seen = []
  call = make(seen)

  def program(n):
    return lax.while_loop(lambda i: i < n, lambda i: _step(call, n, i), 0)

  if refused:
    with pytest.raises(Exception, match=refused):
      jax.jit(jax.vmap(program))(N)
    assert seen == []
    return
  out = jax.jit(jax.vmap(program))(N)
  hostcall.barrier()
  np.testing.assert_array_equal(out, [1, 3])
  assert sorted(seen) == expected


def _step(call, n, i):
  # A call with a result gives back ``i``, which the loop goes on with (a
  # pure callback's would be elided unread); a tap's is its operands.
  result = call(n, i)
  if result is None or isinstance(result, tuple):
    return i + 1
  return result + 1


def test_debug_print_prints_the_lanes_still_looping():
  printed = io.StringIO()
  with contextlib.redirect_stdout(printed):
    jax.jit(jax.vmap(_loop_of(
        lambda n, i: hostcall.debug_print("n={} i={}", n, i))))(N)
    hostcall.barrier()
  assert sorted(printed.getvalue().splitlines()) == [
      "n=1 i=0", "n=3 i=0", "n=3 i=1", "n=3 i=2"]


def test_hostcall_jit_and_no_jit_gate_too():
  for wrap in (hostcall.jit, lambda f: f):
    calls = Calls()
    out = wrap(jax.vmap(lambda n: _count_up(n, calls.hostcall)))(N)
    hostcall.barrier()
    np.testing.assert_array_equal(out, [1, 3])
    assert sorted(calls.seen) == FINISHED_AT_1
