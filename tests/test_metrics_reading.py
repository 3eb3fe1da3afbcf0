"""Runs read back and compared (issue 54): ``metrics.load`` reads a run's
rows and config with NumPy alone (pandas unimportable), several runs (a
list, a glob) read into one table with a run column, DataFrame or not, and
``plot`` / ``hostcall plot`` overlay them."""

import importlib.util
import json
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from hostcall import metrics
from tests.helpers import ROOT, run_python


def _run(root, name, rows, config=None, kind="jsonl"):
  """A run directory as the file writers leave it: ``rows`` (dicts) in
  ``metrics.<kind>``, ``config`` in ``config.json``."""
  path = pathlib.Path(root) / name
  path.mkdir(parents=True)
  if kind == "jsonl":
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps(row) + "\n" for row in rows))
  else:
    names = list(dict.fromkeys(k for row in rows for k in row))
    (path / "metrics.csv").write_text(",".join(names) + "\n" + "".join(
        ",".join(str(row.get(n, "")) for n in names) + "\n" for row in rows))
  if config is not None:
    (path / "config.json").write_text(json.dumps(config))
  return path


def _sweep(root, lrs=(0.1, 0.2, 0.4), steps=4):
  for lr in lrs:
    _run(root, f"lr-{lr}", [{"step": i, "loss": round(1 / (1 + lr * i), 6)}
                            for i in range(steps)], config={"lr": lr})


def test_a_run_is_read_with_numpy_alone_where_pandas_cannot_be_imported(
    tmp_path):
  proc = run_python(f"""
      import sys
      sys.modules["pandas"] = None  # a venv without pandas (make demo's)
      import json, jax, numpy as np, hostcall
      from hostcall import metrics
      run = metrics.Run("fit", root={str(tmp_path)!r}, params={{"lr": 0.1}})
      run.config.update({{"batch": 32}})
      jax.jit(lambda: [run.log(i, loss=1.0 / (i + 1), w=np.ones(2) * i)
                       for i in range(3)])()
      run.close()
      table = metrics.load(run.dir)
      print(json.dumps({{"repr": repr(table), "config": table.config,
                        "steps": table["step"].tolist(),
                        "step_dtype": str(table["step"].dtype),
                        "loss": table["loss"].tolist(),
                        "w": table["w"].tolist(), "rows": table.rows()}}))
      try:
        metrics.read(run.dir)
      except ImportError as exc:
        print(exc)
      print(metrics.plot(run.dir))
      """)
  first, error, png = proc.stdout.strip().splitlines()
  got = json.loads(first)
  assert got["repr"] == "Table(1 run, 3 rows; columns step, loss, w)"
  assert got["config"] == {"lr": 0.1, "batch": 32}
  assert got["steps"] == [0, 1, 2] and got["step_dtype"] == "int64"
  assert got["loss"] == pytest.approx([1.0, 0.5, 1 / 3])
  assert got["w"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
  assert got["rows"][1] == {"step": 1, "loss": 0.5, "w": [1.0, 1.0]}
  assert "pandas is not installed" in error
  assert "hostcall.metrics.load" in error
  assert pathlib.Path(png).read_bytes()[:4] == b"\x89PNG"


def test_columns_are_numpy_arrays_with_nan_where_a_row_has_none(tmp_path):
  path = _run(tmp_path, "mixed", [
      {"step": 0, "loss": 1.0, "phase": "train", "ok": True, "w": [1, 2]},
      {"step": 1, "loss": 0.5, "acc": 0.25, "phase": "eval", "ok": False,
       "w": [3, 4]},
      {"step": 2, "acc": 0.75, "v": [1.0]},
      {"step": 3, "v": [1.0, 2.0]},
  ])
  table = metrics.load(path)
  assert table.columns == ["step", "loss", "phase", "ok", "w", "acc", "v"]
  assert len(table) == 4 and list(table) == table.columns
  assert table["step"].dtype == np.int64
  np.testing.assert_array_equal(table["loss"], [1.0, 0.5, np.nan, np.nan])
  np.testing.assert_array_equal(table["acc"], [np.nan, 0.25, 0.75, np.nan])
  assert table["phase"].tolist() == ["train", "eval", None, None]
  assert table["ok"].tolist() == [True, False, None, None]
  # Of different shapes or missing: an array a row, None where missing.
  assert table["v"].dtype == object
  assert [None if v is None else v.tolist() for v in table["v"]] == [
      None, None, [1.0], [1.0, 2.0]]
  assert table.config == {} and table.runs == ["mixed"]
  assert set(dict(table)) == set(table.columns)
  whole = metrics.load(_run(tmp_path, "whole", [
      {"step": 0, "phase": "a", "ok": True, "w": [1.0, 2.0]},
      {"step": 1, "phase": "b", "ok": False, "w": [3.0, 4.0]}]))
  assert whole["phase"].dtype.kind == "U" and whole["ok"].dtype == bool
  assert whole["w"].shape == (2, 2) and whole["w"].dtype == np.float64
  with pytest.raises(KeyError, match="no column 'nope'; the table has "
                     "'step', 'phase', 'ok', 'w'"):
    whole["nope"]


def test_several_runs_are_one_table_with_a_run_column(tmp_path):
  _sweep(tmp_path)
  (tmp_path / "compare.png").write_bytes(b"not a run")  # a glob skips it
  (tmp_path / "notes").mkdir()
  table = metrics.load(str(tmp_path / "*"))
  assert table.runs == ["lr-0.1", "lr-0.2", "lr-0.4"]
  assert table.columns == ["run", "step", "loss"]
  assert table["run"].tolist() == [f"lr-{lr}" for lr in (0.1, 0.2, 0.4)
                                   for _ in range(4)]
  assert table["loss"][table["run"] == "lr-0.4"].tolist() == [
      1.0, round(1 / 1.4, 6), round(1 / 1.8, 6), round(1 / 2.2, 6)]
  assert table.configs == {"lr-0.1": {"lr": 0.1}, "lr-0.2": {"lr": 0.2},
                           "lr-0.4": {"lr": 0.4}}
  with pytest.raises(ValueError, match=r"holds 3 runs, each with its own "
                     r"config: read table.configs\[run\]"):
    table.config
  listed = metrics.load([tmp_path / "lr-0.4", tmp_path / "lr-0.1"])
  assert listed.runs == ["lr-0.4", "lr-0.1"] and len(listed) == 8
  # A glob that matches one run still says which.
  assert metrics.load(str(tmp_path / "lr-0.2*"))["run"].tolist() == [
      "lr-0.2"] * 4
  # One path: no run column, as before.
  assert metrics.load(tmp_path / "lr-0.1").columns == ["step", "loss"]


def test_several_runs_as_a_dataframe_have_a_run_column(tmp_path):
  pytest.importorskip("pandas")
  _sweep(tmp_path, lrs=(0.1, 0.2), steps=2)
  frame = metrics.read(str(tmp_path / "lr-*"))
  assert list(frame.columns) == ["run", "step", "loss"]
  assert frame.groupby("run")["loss"].last().to_dict() == {
      "lr-0.1": round(1 / 1.1, 6), "lr-0.2": round(1 / 1.2, 6)}
  assert frame.attrs["configs"] == {"lr-0.1": {"lr": 0.1},
                                    "lr-0.2": {"lr": 0.2}}
  one = metrics.read(tmp_path / "lr-0.1")
  assert list(one.columns) == ["step", "loss"]


def test_runs_of_one_name_under_two_roots_are_told_apart_by_path(tmp_path):
  a = _run(tmp_path / "x", "fit", [{"step": 0, "loss": 1.0}])
  b = _run(tmp_path / "y", "fit", [{"step": 0, "loss": 2.0}], kind="csv")
  table = metrics.load([a, b / "metrics.csv"])
  assert table["run"].tolist() == [str(a), str(b / "metrics.csv")]
  assert table["loss"].tolist() == [1.0, 2.0]


def test_what_cannot_be_read_together_is_said(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"no run matches '.*lr-\*': "
                     "a glob takes run directories"):
    metrics.load(str(tmp_path / "lr-*"))
  with pytest.raises(ValueError, match="an empty list"):
    metrics.load([])
  with pytest.raises(TypeError, match=r"the run to read .* is a path"):
    metrics.load([tmp_path, 5])
  a = _run(tmp_path, "a", [{"step": 0, "run": 1.0}])
  assert metrics.load(a)["run"].tolist() == [1.0]  # alone, a metric
  with pytest.raises(ValueError, match="logs a metric named 'run'"):
    metrics.load([a, _run(tmp_path, "b", [{"step": 0, "loss": 1.0}])])


def _svg_lines(path) -> dict[str, list[tuple[float, float]]]:
  """The data lines of an SVG plot, by id (metric/run/where): their
  points, in the image's coordinates."""
  lines = {}
  for group in ET.parse(path).iter("{http://www.w3.org/2000/svg}g"):
    gid = group.get("id", "")
    if "/" in gid:
      d = group.find("{http://www.w3.org/2000/svg}path").get("d")
      lines[gid] = [tuple(map(float, point.split()))
                    for point in d.replace("M", "L").split("L")
                    if point.strip()]
  return lines


def _svg_texts(path) -> list[str]:
  return [t.text for t in ET.parse(path).iter("{http://www.w3.org/2000/svg}text")]


def test_plot_overlays_several_runs_one_line_each(tmp_path):
  pytest.importorskip("matplotlib")
  _sweep(tmp_path)
  out = metrics.plot(str(tmp_path / "lr-*"), tmp_path / "sweep.svg")
  lines = _svg_lines(out)
  assert sorted(lines) == ["loss/lr-0.1", "loss/lr-0.2", "loss/lr-0.4"]
  assert all(len(points) == 4 for points in lines.values())
  # A larger lr falls faster: its last point is lower (a larger y in SVG).
  last = [lines[f"loss/lr-{lr}"][-1][1] for lr in (0.1, 0.2, 0.4)]
  assert last[0] < last[1] < last[2]
  texts = _svg_texts(out)
  assert {"lr-0.1", "lr-0.2", "lr-0.4"} <= set(texts)  # the legend
  assert "lr-0.1, lr-0.2, lr-0.4" in texts  # the title
  default = metrics.plot([tmp_path / "lr-0.1", tmp_path / "lr-0.2"])
  assert default == tmp_path / "compare.png"
  assert default.read_bytes()[:4] == b"\x89PNG"


def test_a_run_s_members_keep_its_colour_in_a_comparison(tmp_path):
  pytest.importorskip("matplotlib")
  _run(tmp_path, "a", [{"step": i, "member": m, "loss": 1.0 + m + i}
                       for i in range(3) for m in range(2)])
  _run(tmp_path, "b", [{"step": i, "loss": 2.0 - i} for i in range(3)])
  out = metrics.plot([tmp_path / "a", tmp_path / "b"], tmp_path / "ab.svg")
  assert sorted(_svg_lines(out)) == ["loss/a/member=0", "loss/a/member=1",
                                     "loss/b"]
  assert {"a: member 0", "a: member 1", "b"} <= set(_svg_texts(out))
  text = out.read_text()
  colour = [text[text.index(f'id="loss/{key}"'):].split("stroke: ")[1][:7]
            for key in ("a/member=0", "a/member=1", "b")]
  assert colour[0] == colour[1] != colour[2]


def _hostcall(*args, cwd=None):
  return subprocess.run([sys.executable, "-m", "hostcall", *args],
                        capture_output=True, text=True, timeout=300,
                        cwd=cwd or ROOT)


def test_hostcall_plot_compares_runs_named_or_globbed(tmp_path):
  pytest.importorskip("matplotlib")
  _sweep(tmp_path, lrs=(0.1, 0.2), steps=3)
  out = tmp_path / "two.svg"
  proc = _hostcall("plot", str(tmp_path / "lr-0.1"), str(tmp_path / "lr-0.2"),
                   "-o", str(out))
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == str(out)
  assert sorted(_svg_lines(out)) == ["loss/lr-0.1", "loss/lr-0.2"]
  proc = _hostcall("plot", "lr-*", cwd=tmp_path)  # a glob no shell expanded
  assert proc.returncode == 0, proc.stderr
  assert pathlib.Path(proc.stdout.strip()) == tmp_path / "compare.png"
  unknown = _hostcall("plot", str(tmp_path / "lr-0.1"),
                      str(tmp_path / "lr-0.2"), "-m", "acc")
  assert unknown.returncode == 2
  assert unknown.stderr.strip().endswith(
      f"no metric 'acc' in {tmp_path / 'lr-0.1'} {tmp_path / 'lr-0.2'}; "
      "it has 'loss'")
  nothing = _hostcall("plot", str(tmp_path / "nope-*"))
  assert nothing.returncode == 2 and "no run matches" in nothing.stderr
  assert "Traceback" not in unknown.stderr + nothing.stderr


def test_a_skipped_row_is_told_at_the_line_that_read_it(tmp_path):
  path = _run(tmp_path, "cut", [{"step": 0, "loss": 1.0}])
  with open(path / "metrics.jsonl", "a") as f:
    f.write('{"step": 1, "lo')
  readers = [metrics.load]
  if importlib.util.find_spec("matplotlib") is not None:
    readers.append(metrics.plot)  # through load, from another module
  for reader in readers:
    with pytest.warns(metrics.IncompleteRowsWarning,
                      match=r"skipped 1 incomplete row\(s\) \(line\(s\) 2\)"
                      ) as caught:
      reader(path)
    assert caught[0].filename == __file__
  with pytest.warns(metrics.IncompleteRowsWarning):
    assert metrics.load(path).rows() == [{"step": 0, "loss": 1.0}]


def test_live_runs_are_read_with_their_rows_so_far_and_their_config(tmp_path):
  import jax
  a = metrics.Run("a", root=tmp_path, writers=["memory"], params={"lr": 1})
  b = metrics.Run("b", root=tmp_path, params={"lr": 2})
  jax.jit(lambda: (a.log(0, loss=1.0), b.log(0, loss=2.0)))()
  table = metrics.load([a, b])  # flushed first: no barrier needed
  assert table["run"].tolist() == ["a", "b"]
  assert table["loss"].tolist() == [1.0, 2.0]
  assert table.configs == {"a": {"lr": 1}, "b": {"lr": 2}}
  a.close(), b.close()
  assert metrics.load(b.dir).config == {"lr": 2}
