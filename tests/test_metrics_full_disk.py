"""The text writers under a full disk (issue 54): a write that fails part
way leaves no torn row; the rows written once there is room again are
whole and read back; a file a stopped process left torn is cut back to its
last whole row before a writer goes on with it."""

import errno
import json
import os
import warnings

import numpy as np
import pytest

from hostcall import metrics
from hostcall._apps.metrics import files, reading
from hostcall._runtime import texts
from tests.helpers import run_python


def _block(steps, **metrics_):
  return metrics.Block(step=np.asarray(steps), metrics={
      name: np.asarray(values, np.float32) for name, values in
      metrics_.items()})


def _read_whole(path):
  """The rows at ``path``, failing the test on any skipped row."""
  with warnings.catch_warnings():
    warnings.simplefilter("error", metrics.IncompleteRowsWarning)
    return reading.read_records(path)


@pytest.mark.parametrize("writer", ["jsonl", "csv"])
def test_rows_written_once_the_disk_has_room_again_are_whole(writer,
                                                             tmp_path):
  # A file size limit (ulimit -f) makes the kernel write what fits and
  # then fail, as a full disk does: the native formatter's writes and
  # Python's alike. Steps 100-199 fail part way; 200-209 come after.
  run_python(f"""
      import resource, signal, jax, hostcall
      from hostcall import metrics, host_callback as hcb
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a kill
      run = metrics.Run("full", root={str(tmp_path)!r}, writers=[{writer!r}])
      f = jax.jit(lambda i: run.log(i, loss=i * 1.0, acc=i * 0.5))
      for i in range(100):
        f(i)
      hostcall.barrier()
      size = (run.dir / "metrics.{writer}").stat().st_size
      soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
      resource.setrlimit(resource.RLIMIT_FSIZE, (size + 517, hard))
      for i in range(100, 200):
        f(i)
      try:
        hostcall.barrier()
        raise SystemExit("the failed write was not reported")
      except hcb.CallbackException as exc:
        assert "File too large" in str(exc), exc
      resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
      for i in range(200, 210):
        f(i)
      run.close()
      """)
  path = tmp_path / "full" / f"metrics.{writer}"
  rows = _read_whole(path)
  steps = [r["step"] for r in rows]
  # The blocks of 100-199 that failed are gone whole; any that came to
  # fit once a failed one was cut off are there whole.
  assert steps[:100] == list(range(100)) and steps[-10:] == list(
      range(200, 210))
  assert len(steps) < 200 and steps == sorted(set(steps))
  assert all(r == {"step": r["step"], "loss": r["step"] * 1.0,
                   "acc": r["step"] * 0.5} for r in rows)
  assert path.read_bytes().endswith(b"\n")


class _FullDisk:
  """``os.write`` to one file writes ``room`` bytes more, then fails with
  ENOSPC (as a full disk does) until ``room`` is None again."""

  def __init__(self, monkeypatch, path):
    self.path, self.room, self._write = path, None, os.write
    monkeypatch.setattr(os, "write", self)
    # The native formatter writes without os.write: the Python path here.
    monkeypatch.setattr(texts, "write_rows", lambda *args, **kw: False)

  def _ours(self, fd):
    try:
      return os.path.samestat(os.fstat(fd), os.stat(self.path))
    except OSError:  # not made yet, or gone
      return False

  def __call__(self, fd, data):
    if self.room is None or not self._ours(fd):
      return self._write(fd, data)
    if self.room == 0:
      raise OSError(errno.ENOSPC, "No space left on device")
    written = self._write(fd, bytes(data[:self.room]))
    self.room -= written
    return written


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_block_a_full_disk_cut_short_is_cut_off_the_file(kind, tmp_path,
                                                          monkeypatch):
  path = tmp_path / f"m.{kind}"
  writer = (metrics.JsonlWriter if kind == "jsonl" else metrics.CsvWriter)(
      path)
  writer.write(_block([0, 1], loss=[1.0, 0.5]))
  before = path.read_bytes()
  disk = _FullDisk(monkeypatch, path)
  disk.room = 30  # a row and a half
  with pytest.raises(OSError, match="No space left on device") as caught:
    writer.write(_block(range(2, 200), loss=np.arange(2, 200) / 4))
  assert caught.value.errno == errno.ENOSPC
  assert path.read_bytes() == before  # not the row and a half
  disk.room = None
  writer.write(_block([200, 201], loss=[9.0, 9.5]))
  writer.close()
  rows = _read_whole(path)
  assert [(r["step"], r["loss"]) for r in rows] == [
      (0, 1.0), (1, 0.5), (200, 9.0), (201, 9.5)]


def test_a_torn_row_that_cannot_be_cut_at_once_is_cut_before_the_next(
    tmp_path, monkeypatch):
  path = tmp_path / "m.jsonl"
  writer = metrics.JsonlWriter(path)
  writer.write(_block([0], loss=[1.0]))
  disk = _FullDisk(monkeypatch, path)
  disk.room = 10
  real_ftruncate = os.ftruncate
  failing = [OSError(errno.EIO, "Input/output error")]

  def ftruncate(fd, size):
    if failing:
      raise failing.pop()
    real_ftruncate(fd, size)
  monkeypatch.setattr(os, "ftruncate", ftruncate)
  with pytest.raises(OSError, match="No space left"):
    writer.write(_block([1, 2], loss=[2.0, 3.0]))
  assert path.read_text() == '{"step": 0, "loss": 1.0}\n{"step": 1'
  disk.room = None
  writer.write(_block([3], loss=[4.0]))
  writer.close()
  assert path.read_text() == ('{"step": 0, "loss": 1.0}\n'
                              '{"step": 3, "loss": 4.0}\n')


def test_a_widened_table_that_cannot_be_written_leaves_the_rows_there_were(
    tmp_path, monkeypatch):
  path = tmp_path / "m.csv"
  writer = metrics.CsvWriter(path)
  writer.write(_block(range(50), loss=np.arange(50)))
  before = path.read_bytes()
  disk = _FullDisk(monkeypatch, tmp_path / "m.csv.widening")
  (tmp_path / "m.csv.widening").touch()
  disk.room = 100
  with pytest.raises(OSError, match="No space left"):
    writer.write(_block([50], loss=[50.0], acc=[1.0]))  # a new column
  assert path.read_bytes() == before
  assert not (tmp_path / "m.csv.widening").exists()
  disk.room = None
  writer.write(_block([51], loss=[51.0], acc=[2.0]))
  writer.close()
  rows = _read_whole(path)
  assert [r["step"] for r in rows] == [*range(50), 51]
  assert rows[-1] == {"step": 51, "loss": 51.0, "acc": 2.0}
  assert "acc" not in rows[0]


@pytest.mark.parametrize("kind, torn", [
    ("jsonl", '{"step": 1, "lo'),
    ("csv", '1,"a\nb'),   # a quoted field cut off after its newline
    ("jsonl", '{"step": 0, "lo'),  # no whole row at all
])
def test_a_writer_going_on_with_a_torn_file_cuts_its_last_row(kind, torn,
                                                              tmp_path):
  path = tmp_path / f"m.{kind}"
  whole = {"jsonl": '{"step": 0, "loss": 1.0}\n',
           "csv": 'step,loss\r\n0,"x\ny"\r\n'}[kind]
  if torn.startswith('{"step": 0'):
    whole = ""
  path.write_bytes((whole + torn).encode())
  with pytest.warns(metrics.IncompleteRowsWarning,
                    match=f"cut off its last row, {len(torn)} byte") as caught:
    writer = (metrics.JsonlWriter if kind == "jsonl" else metrics.CsvWriter)(
        path, append=True)
  assert caught[0].filename == __file__
  assert path.read_bytes() == whole.encode()
  writer.write(metrics.Block(step=np.array([2]), metrics={
      "loss": np.float32([2.0])}))
  writer.close()
  rows = _read_whole(path)
  assert rows[-1] == {"step": 2, "loss": 2.0}
  assert len(rows) == (1 if not whole else 2)


def test_a_whole_file_is_gone_on_with_untouched(tmp_path):
  path = tmp_path / "m.jsonl"
  path.write_text('{"step": 0, "loss": 1.0}\n')
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    writer = metrics.JsonlWriter(path, append=True)
  writer.close()
  assert json.loads(path.read_text()) == {"step": 0, "loss": 1.0}


def test_cut_torn_line_finds_a_line_end_far_back(tmp_path):
  path = tmp_path / "m"
  path.write_bytes(b"a\n" + b"x" * 200_000)
  fd = os.open(path, os.O_RDWR)
  try:
    assert files.cut_torn_line(fd) == 200_000
  finally:
    os.close(fd)
  assert path.read_bytes() == b"a\n"
