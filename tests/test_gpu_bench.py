"""benchmarks/gpu_bench.py, as the device runs it, on this CPU at toy sizes: `prepare` exports the
artifacts with TensorFlow; `run` then loads them in a process where TensorFlow cannot be imported (as on
the device, which has none), gives them the weights of the Keras-on-JAX models it builds, and times and
compares both."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from import_blocker import WITHOUT_TF

BENCH = pathlib.Path(__file__).parents[1] / "benchmarks" / "gpu_bench.py"


def _run(args, env):
  result = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  return result.stdout


@pytest.mark.slow
def test_gpu_bench_prepares_on_tf_and_runs_without_it(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
  artifacts, out = tmp_path / "artifacts", tmp_path / "out"
  _run([str(BENCH), "prepare", "--tiny", "--out", str(artifacts)], dict(env, KERAS_BACKEND="tensorflow"))
  for name in os.listdir(artifacts):
    if (artifacts / name).is_dir():   # the params stay behind: the device writes them
      assert not [f for f in os.listdir(artifacts / name) if f.startswith("params")], name
  printed = _run(["-c", WITHOUT_TF, str(BENCH), "run", "--artifacts", str(artifacts), "--repeats", "2",
                  "--out", str(out)], dict(env, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu"))
  report = json.loads((out / "gpu_bench.json").read_text())
  rows = {(r["model"], r["dtype"]): r for r in report["rows"]}
  assert set(rows) == {(m, d) for m in ("bert", "gpt2", "vit", "resnet50", "efficientnetb0")
                       for d in ("float32", "bfloat16")}
  for (model, dtype), row in rows.items():
    assert row["jaxport_ms"] > 0 and row["keras_jax_ms"] > 0
    # Same weights on both sides: float32 agrees to float32 rounding, bfloat16 to bfloat16's.
    assert row["rel_err"] <= (1e-4 if dtype == "float32" else 5e-2), (model, dtype, row["rel_err"])
  assert "| bert | 2 | float32 |" in printed and "jaxport <= Keras 3 on JAX" in printed
