"""``Run.log`` calls that alternate with other sites' calls in one queued
batch (a ``hostcall.jit`` step that logs and calls back): their rows are
put once a batch (``_apps/metrics/interleaved_rows.py``), while what a
host function between two of them sees (``Run.latest``, the steps of two
sites of one run) is what it was call by call."""

import json

import jax
import jax.numpy as jnp
import pytest

import hostcall
from hostcall._apps.metrics import sink as sink_module, writer_thread

from tests.helpers import HeldConsumer, run_python

STEPS = 40


class _Held(HeldConsumer):
  """``HeldConsumer``, also counting the blocks each run's sink hands to
  the writer thread."""

  def __init__(self, monkeypatch):
    super().__init__(monkeypatch)
    self.blocks = {}
    put = writer_thread.shared.put

    def counted_put(sink, block):
      if isinstance(block, hostcall.metrics.Block):
        self.blocks.setdefault(sink.name, []).append(len(block))
      return put(sink, block)
    monkeypatch.setattr(writer_thread.shared, "put", counted_put)


def _rows(root) -> list[dict]:
  return [json.loads(line) for path in sorted(root.rglob("*.jsonl"))
          for line in path.read_text().splitlines()]


def test_two_sites_of_a_run_between_callbacks_keep_steps_and_order(
    queued, monkeypatch, tmp_path):
  held, seen = _Held(monkeypatch), []
  run = hostcall.metrics.Run("two", root=tmp_path)

  @hostcall.jit
  def program(x):
    def body(c, _):
      run.log(loss=c * 0.5, acc=c)  # steps numbered on the host
      hostcall.debug_callback(lambda v: seen.append(int(v)), c)
      run.log(loss=c * 0.25, acc=-c)  # the same columns: one block
      run.log(grad=c * 1.5)  # other columns: a block of its own
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  held.run(program, jnp.int32(0))
  run.close()
  assert seen == list(range(STEPS))
  assert sum(held.batches) >= 4 * STEPS - 4  # (in a batch or two)
  expected = []
  for c in range(STEPS):
    expected += [{"step": 3 * c, "loss": c * 0.5, "acc": c},
                 {"step": 3 * c + 1, "loss": c * 0.25, "acc": -c},
                 {"step": 3 * c + 2, "grad": c * 1.5}]
  assert _rows(tmp_path) == expected
  # A block a stretch of one run's rows with the same columns (two a
  # step, more only where a batch ends), not a block a row.
  assert len(held.blocks["two"]) <= 2 * STEPS + len(held.batches)
  assert sum(held.blocks["two"]) == 3 * STEPS


def test_a_site_between_callbacks_puts_one_block_a_batch(
    queued, monkeypatch, tmp_path):
  held = _Held(monkeypatch)
  run = hostcall.metrics.Run("one", root=tmp_path)

  @hostcall.jit
  def program(x):
    def body(c, _):
      hostcall.debug_callback(lambda v: None, c)
      run.log(c, loss=c * 0.5, phase="train")
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  held.run(program, jnp.int32(10))
  run.close()
  assert sum(held.blocks["one"]) == STEPS
  assert len(held.blocks["one"]) == len(held.batches)  # one a batch
  assert _rows(tmp_path) == [
      {"step": c, "loss": c * 0.5, "phase": "train"}
      for c in range(10, 10 + STEPS)]


def test_run_latest_between_two_logs_is_the_last_call_before(
    queued, monkeypatch, tmp_path):
  held, seen = _Held(monkeypatch), []
  run = hostcall.metrics.Run("latest", root=tmp_path, writers=["memory"])

  def look(v):
    seen.append((int(v), run.latest("loss"), run.latest("phase"),
                 run.latest("acc")))

  @hostcall.jit
  def program(x):
    def body(c, _):
      hostcall.debug_callback(look, c)
      run.log(loss=c * 0.5, phase="fit")
      hostcall.debug_callback(look, c)
      run.log(acc=c * 2)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  held.run(program, jnp.int32(0))
  expected = []
  for c in range(STEPS):
    acc = None if c == 0 else (2 * c - 1, 2 * (c - 1))
    before = None if c == 0 else (2 * c - 2, (c - 1) * 0.5)
    phase = None if c == 0 else (2 * c - 2, "fit")
    expected.append((c, before, phase, acc))
    expected.append((c, (2 * c, c * 0.5), (2 * c, "fit"), acc))
  assert seen == expected
  assert run.latest("acc") == (2 * STEPS - 1, 2 * (STEPS - 1))
  run.close()


def test_a_callback_failing_mid_batch_loses_no_row(
    queued, monkeypatch, tmp_path):
  held = _Held(monkeypatch)
  run = hostcall.metrics.Run("failing", root=tmp_path)

  def fails_on_odd(v):
    if int(v) % 2:
      raise ValueError(f"odd {int(v)}")

  @hostcall.jit
  def program(x):
    def body(c, _):
      hostcall.debug_callback(fails_on_odd, c)
      run.log(c, loss=c * 0.5)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  with pytest.raises(hostcall.CallbackException) as raised:
    held.run(program, jnp.int32(0))
  assert f"{STEPS // 2} tap function call(s) raised" in str(raised.value)
  run.close()
  assert _rows(tmp_path) == [{"step": c, "loss": c * 0.5}
                             for c in range(STEPS)]


def test_a_block_that_cannot_be_put_fails_alone(
    queued, monkeypatch, tmp_path):
  held = _Held(monkeypatch)
  refused = hostcall.metrics.Run("refused", root=tmp_path)
  kept = hostcall.metrics.Run("kept", root=tmp_path)
  put = sink_module.RunSink.put

  def refuse(sink, block):
    if sink.name == "refused":
      raise OSError("no room")
    return put(sink, block)
  monkeypatch.setattr(sink_module.RunSink, "put", refuse)

  @hostcall.jit
  def program(x):
    def body(c, _):
      refused.log(c, loss=c * 0.5)
      hostcall.debug_callback(lambda v: None, c)
      kept.log(c, acc=c * 2)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  with pytest.raises(hostcall.CallbackException) as raised:
    held.run(program, jnp.int32(0))
  assert "no room" in str(raised.value)
  # (The batch's rows of that run in one block, refused once.)
  assert "1 tap function call(s) raised" in str(raised.value)
  kept.close()
  refused.close()
  assert _rows(kept.dir) == [{"step": c, "acc": c * 2} for c in range(STEPS)]


def test_flush_and_barrier_wait_for_the_batchs_rows(
    queued, monkeypatch, tmp_path):
  held = _Held(monkeypatch)
  run = hostcall.metrics.Run("flushed", root=tmp_path)

  @hostcall.jit
  def program(x):
    def body(c, _):
      hostcall.debug_print("x={}", c)
      run.log(c, loss=c * 0.5)
      hostcall.debug_callback(lambda v: None, c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  held.run(program, jnp.int32(0), barrier=False)
  run.flush()  # (no barrier before it)
  assert len(_rows(tmp_path)) == STEPS
  held.run(program, jnp.int32(STEPS), barrier=False)
  hostcall.barrier()
  assert [r["step"] for r in _rows(tmp_path)] == list(range(2 * STEPS))
  run.close()


def test_under_vmap_each_member_keeps_its_row(queued, monkeypatch, tmp_path):
  held = _Held(monkeypatch)
  run = hostcall.metrics.Run("members", root=tmp_path)

  @hostcall.jit
  @jax.vmap
  def program(x):
    hostcall.debug_callback(lambda v: None, x)
    run.log(7, loss=x)
    hostcall.debug_callback(lambda v: None, x)
    run.log(8, loss=x * 2)
    return x

  held.run(program, jnp.arange(3.0))
  run.close()
  assert _rows(tmp_path) == [
      {"step": s, "member": m, "loss": float(m * k)}
      for s, k in ((7, 1), (8, 2)) for m in range(3)]


@pytest.mark.parametrize("native", ["1", "0"])
def test_logs_between_callbacks_in_a_fresh_process(native, tmp_path):
  # HOSTCALL_NATIVE=0: JAX's callbacks push the calls (items, not a block).
  run_python(f"""
      import json, pathlib, jax, jax.numpy as jnp, hostcall
      run = hostcall.metrics.Run("fresh", root={str(tmp_path)!r})
      seen = []

      @hostcall.jit
      def program(x):
        def body(c, _):
          run.log(loss=c * 0.5)
          hostcall.debug_callback(
              lambda v: seen.append((int(v), run.latest("loss"))), c)
          run.log(acc=c)
          return c + 1, None
        return jax.lax.scan(body, x, None, length=300)[0]

      program(jnp.int32(0))
      hostcall.barrier()
      assert seen == [(c, (2 * c, c * 0.5)) for c in range(300)], seen[:4]
      run.close()
      rows = [json.loads(l) for l in
              (run.dir / "metrics.jsonl").read_text().splitlines()]
      assert rows == [r for c in range(300) for r in (
          {{"step": 2 * c, "loss": c * 0.5}},
          {{"step": 2 * c + 1, "acc": c}})], rows[:4]
      assert hostcall.queue_stats()["native"] == {native == "1"}
  """, env={"HOSTCALL_NATIVE": native})


class _Events(hostcall.metrics.Writer):
  """Keeps what the writer thread hands it, in order."""

  def __init__(self):
    self.events = []

  def write(self, block):
    self.events += [("row", r["step"], sorted(r)) for r in block.records()]

  def write_config(self, config):
    self.events.append(("config", config.get("c")))


def test_a_config_change_between_logs_comes_after_the_rows_before_it(
    queued, monkeypatch, tmp_path):
  held, events = _Held(monkeypatch), _Events()
  run = hostcall.metrics.Run("config", root=tmp_path, writers=[events])

  def change(v):
    run.config.update({"c": int(v)}, allow_val_change=True)

  @hostcall.jit
  def program(x):
    def body(c, _):
      run.log(c, loss=c * 0.5)
      hostcall.debug_callback(change, c)
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  held.run(program, jnp.int32(0))
  run.close()
  assert events.events == [e for c in range(STEPS) for e in (
      ("row", c, ["loss", "step"]), ("config", c))]


def test_rows_of_a_site_under_vmap_between_a_sites_rows_keep_their_order(
    queued, monkeypatch, tmp_path):
  held, events = _Held(monkeypatch), _Events()
  run = hostcall.metrics.Run("mixed", root=tmp_path, writers=[events])

  def members(c):
    run.log(c, w=c * 2.0)
    return c

  @hostcall.jit
  def program(x):
    def body(c, _):
      run.log(c, loss=c * 0.5)
      hostcall.debug_callback(lambda v: None, c)
      jax.vmap(members)(jnp.stack([c, c]))
      return c + 1, None
    return jax.lax.scan(body, x, None, length=STEPS)[0]

  held.run(program, jnp.int32(0))
  run.close()
  assert events.events == [e for c in range(STEPS) for e in (
      ("row", c, ["loss", "step"]), ("row", c, ["member", "step", "w"]),
      ("row", c, ["member", "step", "w"]))]
