"""How hostcall.jit's queued calls travel: a program's last call returns
nothing, the consumer takes a batch's calls in packed runs of one site,
and reads their operands as columns of their dtypes."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hostcall
from hostcall._runtime import (call_sites, emission, native_queue,
                               queue_library, tap_queue)
from hostcall._jit import routes


def _custom_calls(compiled_text: str) -> list:
  return [target for target in ("hostcall_enqueue_threaded",
                                "hostcall_enqueue_after")
          for _ in range(compiled_text.count(f'"{target}"'))]


def _program(seen):
  def note(label):
    return lambda *args: seen.append(
        (label, *[np.asarray(a).tolist() for a in args]))

  def step(x):
    hostcall.debug_callback(note("first"), x)

    def body(carry, k):
      hostcall.debug_callback(note("scan"), k)
      return carry + k, None
    total, _ = jax.lax.scan(body, x, jnp.arange(3.0))
    hostcall.debug_callback(note("middle"), total)
    jax.lax.cond(total > 4, lambda: hostcall.debug_callback(note("big"), total),
                 lambda: hostcall.debug_callback(note("small"), total))
    hostcall.debug_callback(note("last"), x, total)
    return total
  return step


@pytest.mark.parametrize("route", ["ffi", "python"])
def test_the_last_call_returns_nothing_and_every_call_keeps_its_order(
    queued, route, monkeypatch):
  if route == "python":
    monkeypatch.setattr(emission, "route", lambda *args: "python")
  elif not queue_library.ffi():
    pytest.skip("HOSTCALL_NATIVE=0: JAX's callbacks push the calls")
  seen = []
  step = hostcall.jit(_program(seen))
  for i in range(20):
    step(np.float32(i))
  hostcall.barrier()
  expected = [call for i in range(20) for call in (
      ("first", float(i)), ("scan", 0.0), ("scan", 1.0), ("scan", 2.0),
      ("middle", i + 3.0), ("big" if i + 3 > 4 else "small", i + 3.0),
      ("last", float(i), i + 3.0))]
  assert seen == expected
  if route == "ffi":
    program = step._hostcall_jitted.route(routes.Queued).program
    text = program.lower(np.float32(0)).compile(
        ).as_text()
    # Every call but the last returns the value the next one takes.
    assert sorted(_custom_calls(text)) == (
        ["hostcall_enqueue_after"] + ["hostcall_enqueue_threaded"] * 5)


def test_a_program_ending_in_a_loop_keeps_the_loops_calls(queued):
  seen = []

  @hostcall.jit
  def step(x):
    def body(carry, k):
      hostcall.debug_callback(lambda v: seen.append(float(v)), carry * k)
      return carry + 1, None
    return jax.lax.scan(body, x, jnp.arange(1.0, 4.0))[0]

  assert float(step(np.float32(1))) == 4.0
  hostcall.barrier()
  assert seen == [1.0, 4.0, 9.0]
  if not queue_library.ffi():
    return  # (HOSTCALL_NATIVE=0: JAX's callbacks push the calls)
  program = step._hostcall_jitted.route(routes.Queued).program
  text = program.lower(np.float32(0)).compile(
      ).as_text()
  assert _custom_calls(text) == ["hostcall_enqueue_threaded"]


def test_one_call_of_many_operands_returns_nothing(queued):
  seen = []

  @hostcall.jit
  def step(x):
    hostcall.debug_callback(lambda *a: seen.append([v.tolist() for v in a]),
                            x, x.astype(jnp.int8), x > 0)
    return x

  step(np.float32([1.5, -2.0]))
  hostcall.barrier()
  assert seen == [[[1.5, -2.0], [1, -2], [True, False]]]
  if not queue_library.ffi():
    return  # (HOSTCALL_NATIVE=0: JAX's callbacks push the calls)
  text = step._hostcall_jitted.route(routes.Queued).program.lower(
      np.float32([0, 0])).compile().as_text()
  assert _custom_calls(text) == ["hostcall_enqueue_after"]


def test_a_batch_is_cut_into_runs_of_one_site_and_size():
  sites = np.array([3, 3, 5, 5, 5, 3, 7], np.int64)
  sizes = np.array([2, 2, 1, 1, 1, 2, 0], np.int64)
  block = np.arange(int(sizes.sum()), dtype=np.uint8)
  runs = native_queue.Packed.runs_of(sites, sizes, block)
  assert [(r.site, r.count, r.size) for r in runs] == [
      (3, 2, 2), (5, 3, 1), (3, 1, 2), (7, 1, 0)]
  assert runs[0].rows().tolist() == [[0, 1], [2, 3]]
  assert runs[1].rows().tolist() == [[4], [5], [6]]
  assert runs[2].items() == [(3, None, bytes([7, 8]))]
  assert runs[3].items() == [(7, None, b"")]
  assert len(runs[1]) == 3
  runs[1].clear()
  assert runs[1].block is None


def _packed(site, layouts, rows):
  raw = b"".join(rows)
  return native_queue.Packed(site, len(rows), len(rows[0]),
                       np.frombuffer(raw, np.uint8))


def test_columns_of_mixed_dtypes_at_any_offset():
  # An int8 first puts the float32 and the float64 after it off their
  # alignment: each is still read as its dtype.
  Layout = call_sites.Layout
  layouts = (Layout((), np.int8), Layout((2,), np.float32),
             Layout((), np.float64), Layout((3,), np.int16))
  calls = [(np.int8(k), np.float32([k, -k]), np.float64(k / 3),
            np.int16([k, 2 * k, 3 * k])) for k in range(5)]
  rows = [b"".join(np.asarray(v).tobytes() for v in call) for call in calls]
  columns = call_sites.read_columns("target", layouts,
                                    _packed(1, layouts, rows))
  for column, layout, values in zip(columns, layouts, zip(*calls)):
    assert column.dtype == layout.dtype
    assert column.flags.c_contiguous
    np.testing.assert_array_equal(column, np.stack(values))


def test_columns_of_sub_byte_values_are_read_call_by_call():
  layouts = (call_sites.Layout((3,), ml_dtypes.int4),
             call_sites.Layout((), np.uint8))
  calls = [(np.array([1, -2, 3], ml_dtypes.int4), np.uint8(k))
           for k in range(4)]

  def packed_bytes(call):
    codes = call[0].view(np.uint8) & 0xF
    return bytes([codes[0] | codes[1] << 4, codes[2]]) + call[1].tobytes()

  rows = [packed_bytes(call) for call in calls]
  columns = call_sites.read_columns("target", layouts,
                                    _packed(1, layouts, rows))
  np.testing.assert_array_equal(columns[0].astype(np.int8),
                                np.int8([[1, -2, 3]] * 4))
  np.testing.assert_array_equal(columns[1], np.arange(4, dtype=np.uint8))


def test_columns_refuse_rows_of_the_wrong_size():
  layouts = (call_sites.Layout((2,), np.float32),)
  rows = [np.float32([1, 2, 3]).tobytes()] * 2
  with pytest.raises(RuntimeError, match="12 bytes each where their call "
                     "site describes 8"):
    call_sites.read_columns("target", layouts, _packed(1, layouts, rows))


def test_items_are_handed_over_in_runs_of_one_site():
  items = [(site, [np.float32([site])], None) for site in (4, 4, 9, 4)]
  runs = native_queue.runs(items)
  assert [[item[0] for item in run] for run in runs] == [[4, 4], [9], [4]]
  assert [float(run[0][1][0][0]) for run in runs] == [4.0, 9.0, 4.0]
  assert native_queue.runs([]) == []


def test_a_kept_value_holds_its_own_bytes_not_the_batchs(queued):
  # A host function that keeps a small value it was given keeps only its
  # site's copy (the site's calls in the batch, read together): not the
  # block that held the batch (here 120 KB of another site's calls), and
  # aligned wherever the calls lay in the block.
  kept = []

  @hostcall.jit
  def f(x):
    # Runs of two calls of a site (a run of one is read call by call), of
    # one byte, then of four at an odd place in the block.
    def byte(c, k):
      hostcall.debug_callback(kept.append, (c + k).astype(jnp.int8))
      return c, None
    jax.lax.scan(byte, x, jnp.arange(2))

    def word(c, k):
      hostcall.debug_callback(kept.append, c + k)
      return c, None
    jax.lax.scan(word, x, jnp.arange(2))

    def large(c, k):
      hostcall.debug_callback(lambda v: None,
                              jnp.full(15_000, c + k, jnp.float32))
      return c, None
    jax.lax.scan(large, x, jnp.arange(2))
    return x

  for i in range(20):
    f(jnp.int32(i))
  hostcall.barrier()
  assert [int(v) for v in kept] == [
      i + k for i in range(20) for _ in range(2) for k in range(2)]
  for value in kept:
    root = value
    while isinstance(root.base, np.ndarray):
      root = root.base
    # (At most the 40 calls of the four-byte site.)
    assert root.nbytes <= 40 * 4, root.nbytes
    assert value.flags.aligned


# (format, the step's arguments, whether a run is written at once)
_RUN_PRINTS = [
    ("x={} i={}!", lambda x, i: (x, i), True),
    ("{}", lambda x, i: (x * 2,), True),
    ("{} {} {}", lambda x, i: (i.astype(jnp.uint8), x, i), True),
    ("x={:.3f}", lambda x, i: (x,), False),          # a format spec
    ("flag {}", lambda x, i: (x > 1,), False),        # a bool
    ("half {}", lambda x, i: (x.astype(jnp.bfloat16),), False),
    ("row {}", lambda x, i: (jnp.stack([x, x]),), False),   # not 0-d
    ("caf\u00e9 {}", lambda x, i: (x,), False),       # not ASCII
]
_RUN_VALUES = np.array([0.1, 1e20, -0.0, np.nan, np.inf, -np.inf, 3.0,
                        1 / 3, 1e-7, 123456.789, 2.5, -7.0], np.float32)


@pytest.mark.parametrize("fmt, arguments, at_once", _RUN_PRINTS,
                         ids=[p[0] for p in _RUN_PRINTS])
@pytest.mark.parametrize("flavour", ["jax", "hostcall"])
def test_a_run_of_queued_prints_writes_what_jax_jit_writes(
    queued, fmt, arguments, at_once, flavour, capfd, monkeypatch):
  # A site's queued prints taken together are formatted in one native call
  # where the format is plain {} fields of 0-d numbers: the same text as
  # jax.jit's prints, call by call; other formats each call as before.
  from hostcall._runtime import calls
  print_ = jax.debug.print if flavour == "jax" else hostcall.debug_print

  def step(x, i):
    print_(fmt, *arguments(x, i))
    return x + 1

  written = []
  run_lines = calls.run_lines
  monkeypatch.setattr(calls, "run_lines", lambda *a: written.append(
      run_lines(*a)) or written[-1])
  texts = []
  for jit in (jax.jit, hostcall.jit):
    f = jit(step)
    # Every call gathered into one batch: the barrier ends the window.
    monkeypatch.setattr(tap_queue.consumer, "gather", 3600.0)
    for k, v in enumerate(_RUN_VALUES):
      f(jnp.float32(v), jnp.int32(k))
    jax.effects_barrier()
    hostcall.barrier()
    texts.append(capfd.readouterr().out)
  assert len(texts[0].splitlines()) == len(_RUN_VALUES)
  assert texts[1] == texts[0]
  assert True in written if at_once else True not in written
