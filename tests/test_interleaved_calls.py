"""A program that makes several queued calls: its calls of several sites
alternate in the queue, and the consumer reads each site's calls of a
batch at once (``native_queue.Interleaved``), then delivers them in
program order (``interleaved.deliver``), each failing alone."""

import io
import json
import sys
import unittest.mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hostcall
from hostcall import _jax_private
from hostcall._core.context import call_context, make_context
from hostcall._core.targets import PostponingTarget
from hostcall._runtime import call_sites, errors, interleaved, native_queue

from tests.helpers import HeldConsumer, run_python

STEPS = 40


def test_an_alternating_batch_is_read_once_a_site():
  sites = np.array([3, 5, 3, 5, 5, 3], np.int64)
  sizes = np.array([2, 1, 2, 1, 1, 2], np.int64)
  block = np.arange(int(sizes.sum()), dtype=np.uint8)
  batch = native_queue.Interleaved.or_runs(sites, sizes, block)
  assert isinstance(batch, native_queue.Interleaved)
  assert len(batch) == 6 and batch.site_ids() == [3, 5]
  assert batch.order() == ([3, 5, 3, 5, 3], [1, 1, 1, 2, 1])
  by_site = batch.by_site()
  assert by_site[3].rows().tolist() == [[0, 1], [3, 4], [7, 8]]
  assert by_site[5].rows().tolist() == [[2], [5], [6]]
  assert [(r.site, r.count) for r in batch.runs()] == [
      (3, 1), (5, 1), (3, 1), (5, 2), (3, 1)]


@pytest.mark.parametrize("sites, sizes", [
    ([3, 3, 5, 5], [2, 2, 1, 1]),  # no site in two runs
    ([3, 5, 3], [2, 1, 4]),  # a site of two sizes
    ([3], [2]),
])
def test_other_batches_are_handed_in_runs(sites, sizes):
  sites, sizes = np.array(sites, np.int64), np.array(sizes, np.int64)
  block = np.zeros(int(sizes.sum()), np.uint8)
  runs = native_queue.Interleaved.or_runs(sites, sizes, block)
  assert isinstance(runs, list)
  assert sum(len(r) for r in runs) == len(sites)


class _Noting(PostponingTarget):
  """A target that notes each call's value and context (failing on 13)."""

  def __init__(self, name, seen):
    self.name, self.seen = name, seen

  def deliver(self, flat_args, context):
    value = flat_args[0].tolist()
    if value == 13:
      raise ValueError("13")
    self.seen.append((self.name, value, call_context() is context))
    return ()


class _Consumer:
  _bypassing = False


def test_a_batch_is_delivered_site_by_site_in_queue_order():
  # Sites of different sizes, one that cannot be read (its calls' size
  # is not its layouts'), a call failing in the middle: the others are
  # delivered, in order, each in its site's context.
  seen, Layout = [], call_sites.Layout
  device = jax.devices()[0]
  refs = [call_sites.sites.add(_Noting(name, seen), make_context((), device),
                               (Layout(shape, dtype),), joinable=True)
          for name, shape, dtype in (("a", (), np.int32),
                                     ("b", (2,), np.int8),
                                     ("broken", (), np.int64))]
  a, b, broken = (ref.site for ref in refs)
  calls = [(a, np.int32(0)), (b, np.int8([1, 2])), (a, np.int32(13)),
           (broken, np.int32(3)), (b, np.int8([4, 5])), (b, np.int8([6, 7])),
           (a, np.int32(8)), (broken, np.int32(9))]
  sites = np.array([site for site, _ in calls], np.int64)
  sizes = np.array([v.nbytes for _, v in calls], np.int64)
  block = np.frombuffer(b"".join(v.tobytes() for _, v in calls), np.uint8)
  batch = native_queue.Interleaved.or_runs(sites, sizes, block)
  assert isinstance(batch, native_queue.Interleaved)
  errors.take_postponed()
  interleaved.deliver(batch, _Consumer(), None)
  assert seen == [("a", 0, True), ("b", [1, 2], True), ("b", [4, 5], True),
                  ("b", [6, 7], True), ("a", 8, True)]
  _, formatted, count = errors.take_postponed()
  # The failing call, and each of the broken site's two runs.
  assert count == 3
  assert "4 bytes each where their call site describes 8" in formatted
  assert call_context() is None  # (the consumer's own context restored)
  del refs


def _site_values(k, c):
  """Site ``k``'s operands at step ``c``: sizes differ from site to site
  (and a site without operands follows them)."""
  return [(c + k).astype(jnp.float32),
          jnp.full((k % 3 + 1,), c * k).astype(jnp.int8),
          jnp.stack([c, -c]).astype(jnp.float32) * k][: 1 + k % 3]


def _interleaved_program(n_sites, seen):
  def note(k):
    return lambda *values: seen.append(
        (k, *[np.asarray(v).tolist() for v in values]))

  @hostcall.jit
  def program(x):
    def body(c, _):
      for k in range(n_sites):
        hostcall.debug_callback(note(k), *_site_values(k, c))
      hostcall.debug_callback(note("none"))  # a call without operands
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]
  return program


def _expected(n_sites):
  out = []
  for c in range(STEPS):
    for k in range(n_sites):
      values = [float(c + k),
                [int(np.array(c * k).astype(np.int8))] * (k % 3 + 1),
                [float(c * k), float(-c * k)]][: 1 + k % 3]
      out.append((k, *values))
    out.append(("none",))
  return out


@pytest.mark.parametrize("n_sites", [2, 3, 10])
def test_interleaved_sites_are_delivered_in_program_order(
    queued, monkeypatch, n_sites):
  batches, seen = HeldConsumer(monkeypatch), []
  batches.run(_interleaved_program(n_sites, seen), jnp.int32(0))
  assert seen == _expected(n_sites)
  # (The calls came in one batch or a few: each site in several runs.)
  assert sum(batches.batches) >= STEPS * (n_sites + 1) - n_sites - 1


def test_a_failing_call_in_the_middle_of_a_batch(queued, monkeypatch):
  batches, seen = HeldConsumer(monkeypatch), []

  def fails_on_odd(v):
    if int(v) % 2:
      raise ValueError(f"odd {int(v)}")
    seen.append(("even", int(v)))

  @hostcall.jit
  def program(x):
    def body(c, _):
      hostcall.debug_callback(lambda v: seen.append(("before", int(v))), c)
      hostcall.debug_callback(fails_on_odd, c)
      hostcall.debug_callback(lambda v: seen.append(("after", int(v))), c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  with pytest.raises(hostcall.CallbackException) as raised:
    batches.run(program, jnp.int32(0))
  assert seen == [call for c in range(STEPS) for call in (
      ("before", c), *([("even", c)] if c % 2 == 0 else []), ("after", c))]
  assert f"{STEPS // 2} tap function call(s) raised" in str(raised.value)
  assert f"odd {STEPS - 1}" in str(raised.value)
  assert sum(batches.batches) >= 3 * STEPS - 3
  hostcall.barrier()  # the failures were raised once


def test_prints_and_callbacks_keep_their_order_on_one_stream(
    queued, monkeypatch):
  # Every kind writes to the same stream: the text is in program order.
  batches, out = HeldConsumer(monkeypatch), io.StringIO()

  @hostcall.jit
  def program(x):
    def body(c, _):
      hostcall.debug_print("hp {}", c)
      hostcall.debug_callback(lambda v: print(f"hc {int(v)}"), c + 100)
      jax.debug.print("jp {}", c + 200)
      jax.debug.callback(lambda v: print(f"jc {int(v)}"), c + 300)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  monkeypatch.setattr("sys.stdout", out)
  batches.run(program, jnp.int32(0))
  assert out.getvalue().splitlines() == [
      line for c in range(STEPS)
      for line in (f"hp {c}", f"hc {c + 100}", f"jp {c + 200}",
                   f"jc {c + 300}")]


@pytest.mark.parametrize("printer", [hostcall.debug_print, jax.debug.print])
def test_a_print_whose_stream_a_callback_closed_goes_to_sys_stdout(
    queued, monkeypatch, printer):
  # Prints go where sys.stdout was at the dispatch, until that stream is
  # closed (here by a callback between two prints): then to sys.stdout.
  batches = HeldConsumer(monkeypatch)
  first, later, before_closing = io.StringIO(), io.StringIO(), []

  def close_at_2(v):
    if int(v) == 2:
      before_closing.append(first.getvalue())
      first.close()

  @hostcall.jit
  def program(x):
    def body(c, _):
      printer("p {}", c)
      hostcall.debug_callback(close_at_2, c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  def dispatched(x):
    out = program(x)
    sys.stdout = later  # (put back by monkeypatch)
    return out

  monkeypatch.setattr("sys.stdout", first)
  batches.run(dispatched, jnp.int32(0))
  assert before_closing == ["p 0\np 1\np 2\n"]
  assert later.getvalue().splitlines() == [f"p {c}" for c in range(3, STEPS)]
  assert batches.batches  # (one interleaved batch or a few)


def test_jax_callbacks_see_jaxs_contexts_and_no_other_call_does(
    queued, monkeypatch):
  # JAX's contexts (its default device) are entered for jax.debug.callback
  # once for many calls; hostcall's callbacks between them never see them.
  batches, seen = HeldConsumer(monkeypatch), []

  def probe(kind):
    return lambda v: seen.append((kind, jax.config.jax_default_device,
                                  int(v)))

  @hostcall.jit
  def program(x):
    def body(c, _):
      jax.debug.callback(probe("jax"), c)
      jax.debug.print("{}", c)  # a print between: JAX's contexts stay
      jax.debug.callback(probe("jax"), c + 1)
      hostcall.debug_callback(probe("hostcall"), c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  monkeypatch.setattr("sys.stdout", io.StringIO())
  batches.run(program, jnp.int32(0))
  cpu = jax.devices("cpu")[0]
  assert seen == [call for c in range(STEPS) for call in (
      ("jax", cpu, c), ("jax", cpu, c + 1), ("hostcall", None, c))]


@pytest.mark.parametrize("size", [1, 3, 10_000])
def test_jax_callbacks_between_other_calls_get_arrays_they_may_keep(
    queued, monkeypatch, size):
  # A batch's small values are placed together before the calls (large
  # ones at each call): each callback still gets committed CPU arrays of
  # its own call's values, which it may keep past the batch.
  batches, kept, seen = HeldConsumer(monkeypatch), [], []
  placing = []
  monkeypatch.setattr(interleaved, "_placed_first", _noting(
      interleaved._placed_first, placing))

  @hostcall.jit
  def program(x):
    def body(c, _):
      jax.debug.callback(lambda a, b: kept.append((a, b)),
                         jnp.full(size, c, jnp.float32), c * 3)
      hostcall.debug_callback(lambda v: seen.append(int(v)), c)
      jax.debug.callback(lambda a: kept.append((a,)), c.astype(jnp.int8))
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  batches.run(program, jnp.int32(0))
  assert seen == list(range(STEPS))
  cpu = jax.devices("cpu")[0]
  assert len(kept) == 2 * STEPS
  for c in range(STEPS):
    (a, b), (d,) = kept[2 * c], kept[2 * c + 1]
    for array in (a, b, d):
      assert isinstance(array, jax.Array) and array.committed
      assert array.devices() == {cpu}
    np.testing.assert_array_equal(a, np.full(size, c, np.float32))
    assert (a.dtype, b.dtype, int(b)) == (np.float32, np.int32, 3 * c)
    assert (d.dtype, d.shape, int(d)) == (np.int8, (), c)
  # JAX's callbacks' values placed first where the site's are small (not
  # 10,000 floats a call, 1.6 MB a batch); hostcall's callback has nothing
  # to place.
  small = interleaved._PLACED_FIRST
  assert {(jax_s, site_bytes <= small) for jax_s, site_bytes, _ in placing
          } == ({(True, True), (True, size < 1000), (False, True)})
  assert all(placed == (jax_s and site_bytes <= small)
             for jax_s, site_bytes, placed in placing)


def _noting(placed_first, placing: list):
  """``_placed_first`` noting, for each site, ``(whether its host function
  places values, the site's bytes, whether they were placed first)``."""
  def noted(call, flats, single, columns):
    result = placed_first(call, flats, single, columns)
    placing.append((_jax_private.placement_of(call) is not None,
                    sum(c.nbytes for c in columns), result is not None))
    return result
  return noted


def test_a_value_that_cannot_be_placed_first_is_placed_at_its_call(
    monkeypatch):
  calls_with = []

  def places(value):
    if value == 2:
      raise ValueError("cannot place 2")
    return ("placed", value)

  def call(value):
    raise AssertionError("not called here")
  monkeypatch.setitem(_runtime_placements(), call,
                      (places, calls_with.append))
  columns = [np.arange(4)]
  assert interleaved._placed_first(call, [0, 1, 2, 3], True, columns) is None
  # The other values: each placed, then the call that takes them.
  assert interleaved._placed_first(call, [0, 1, 3], True, columns) == (
      calls_with.append, [("placed", 0), ("placed", 1), ("placed", 3)])
  # Values over the bound: each placed at its call.
  big = [np.zeros(interleaved._PLACED_FIRST + 1, np.uint8)]
  assert interleaved._placed_first(call, [0], True, big) is None
  # A host function that is not jax.debug.callback's: each call as before.
  assert interleaved._placed_first(lambda v: v, [0], True, columns) is None


def _runtime_placements() -> dict:
  from hostcall._jax_private import runtime
  return runtime._PLACEMENTS


class _WithItsOwnParts:
  """A user's callable whose attributes might be taken for hostcall's: a
  ``places`` method, and any other name (``lines_of``) answered."""

  def __init__(self):
    self.seen = []

  def __call__(self, v):
    self.seen.append(int(v))

  def places(self, v):
    raise AssertionError("a user's method, not hostcall's")

  def __getattr__(self, name):  # (as a mock's: a mock for any name)
    return unittest.mock.Mock(name=name)


@pytest.mark.parametrize("alone", [True, False])
def test_a_users_callable_is_called_whatever_its_attributes(
    queued, monkeypatch, alone):
  # Whether its site's calls come in runs of their own or between other
  # calls, a user's callable object is called, as under jax.jit, however
  # its attributes are named.
  batches, other = HeldConsumer(monkeypatch), []
  for jit in (jax.jit, hostcall.jit):
    user = _WithItsOwnParts()

    def body(c, _):
      hostcall.debug_callback(user, c)
      if not alone:
        hostcall.debug_callback(lambda v: other.append(int(v)), c)
      return c + 1, None
    program = jit(lambda x: jax.lax.scan(body, x, None, length=STEPS)[0])
    batches.run(program, jnp.int32(0))
    assert user.seen == list(range(STEPS)), jit


def test_metrics_rows_between_other_calls(queued, monkeypatch, tmp_path):
  batches, seen = HeldConsumer(monkeypatch), []
  run = hostcall.metrics.Run("interleaved", root=tmp_path)

  @hostcall.jit
  def program(x):
    def body(c, _):
      hostcall.debug_callback(lambda v: seen.append(int(v)), c)
      run.log(c, loss=c * 0.5, acc=c * 2)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  batches.run(program, jnp.int32(0))
  run.close()
  assert seen == list(range(STEPS))
  rows = [json.loads(line) for path in tmp_path.rglob("*.jsonl")
          for line in path.read_text().splitlines()]
  assert [(r["step"], r["loss"], r["acc"]) for r in rows] == [
      (c, c * 0.5, c * 2) for c in range(STEPS)]


@pytest.mark.parametrize("native", ["1", "0"])
def test_interleaved_sites_in_a_fresh_process(native):
  # HOSTCALL_NATIVE=0: JAX's callbacks push the calls (items, not a block).
  proc = run_python("""
      import jax, jax.numpy as jnp, hostcall
      seen = []

      @hostcall.jit
      def program(x):
        def body(c, _):
          hostcall.debug_callback(lambda v: seen.append(("a", int(v))), c)
          hostcall.debug_callback(lambda v, w: seen.append(
              ("b", int(v), w.tolist())),
              c * 2, jnp.full(3, c % 100, jnp.int8))
          hostcall.debug_print("p {}", c)
          return c + 1, None
        return jax.lax.scan(body, x, None, length=300)[0]

      program(jnp.int32(0))
      hostcall.barrier()
      assert seen == [call for c in range(300) for call in (
          ("a", c), ("b", 2 * c, [c % 100] * 3))], seen[:6]
      print("native", hostcall.queue_stats()["native"])
  """, env={"HOSTCALL_NATIVE": native})
  lines = proc.stdout.splitlines()
  assert lines[:-1] == [f"p {c}" for c in range(300)]
  assert lines[-1] == f"native {native == '1'}"
