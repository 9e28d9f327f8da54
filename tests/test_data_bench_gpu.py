"""benchmarks/data_bench.py's gpu section at toy sizes, as the device runs it (without TensorFlow:
the tf.data rows are skipped with the reason) and as this machine runs it (with them)."""
import json
import pathlib
import subprocess
import sys

import pytest

from import_blocker import WITHOUT_TF

BENCH = pathlib.Path(__file__).parents[1] / "benchmarks" / "data_bench.py"
TOY = ["gpu", "--batches", "2", "--tf-batches", "2", "--workers", "0", "--repeats", "2"]


def _run(tmp_path, *prefix) -> dict:
  result = subprocess.run([sys.executable, *prefix, str(BENCH), *TOY, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "Loader feeding" in result.stdout
  return json.loads((tmp_path / "data_bench_gpu.json").read_text())


@pytest.mark.slow
def test_gpu_section_runs_without_tensorflow(tmp_path):
  report = _run(tmp_path, "-c", WITHOUT_TF)
  assert "TensorFlow is not installed" in report["skipped"]
  modes = [row["mode"] for row in report["rows"]]
  assert modes[:2] == ["DataLoader alone", "naive device_put loop"]
  assert [m for m in modes if m.startswith("jaxport")] == [
      f"jaxport, prefetch {p}" for p in (0, 1, 2, 4)]
  assert not any(m.startswith("tf.data") for m in modes)
  assert all(row["s"] > 0 and len(row["samples"]) == 2 for row in report["rows"])


@pytest.mark.slow
def test_gpu_section_times_tf_data_where_installed(tmp_path):
  pytest.importorskip("tensorflow")
  report = _run(tmp_path)
  assert report["skipped"] is None
  tf_rows = [row["mode"] for row in report["rows"] if row["mode"].startswith("tf.data")]
  assert tf_rows[0] == "tf.data cached 2 batches, bare"
  assert "tf.data cached, one jaxport loader's epochs, prefetch 0" in tf_rows
  # every loader row has its target against the bare iteration
  assert sum(text.endswith("within 25% of bare tf.data") for text in report["targets"]) == len(tf_rows) - 1
