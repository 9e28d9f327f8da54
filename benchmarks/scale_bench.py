"""Scale benchmark: Llama-style keras-hub backbones (random weights, float32, batch 1, sequence 128).

Each size runs in its own processes, each phase's peak RSS measured from /proc/self/status (VmHWM,
reset between phases through /proc/self/clear_refs), as a multiple of the weights' bytes:

- `tf`: TF (Keras 3 on TF) builds the model and runs a forward: what TF itself holds;
- `jaxport`: in the same process, `jaxport.convert`, a jitted run, then `jaxport.export`: the peak
  above what TF held (target: <= 2x the weights), seconds of each, steady run seconds;
- `load`: a fresh process with TensorFlow blocked: `jaxport.load` (target: <= 1.1x above the imports),
  first call and steady run; `load8`: the same with 8 simulated CPU devices, `sharding="fsdp"`;
- `keras_jax`: Keras 3 on JAX builds the model and runs it jitted (beside, for comparison);
  tf2jax when installed.

  python benchmarks/scale_bench.py [--sizes 0.1B,0.4B,1B] [--out benchmarks/out]

Prints a markdown table and writes benchmarks/out/scale_bench.png. Nothing downloads.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).parent
SEQ = 128
# name -> LlamaBackbone config (params: 0.10B, 0.41B, 1.04B)
SIZES = {
    "0.1B": dict(vocabulary_size=32000, num_layers=12, num_query_heads=12, num_key_value_heads=4, hidden_dim=768,
                 intermediate_dim=2048),
    "0.4B": dict(vocabulary_size=32000, num_layers=24, num_query_heads=16, num_key_value_heads=8, hidden_dim=1024,
                 intermediate_dim=4096),
    "1B": dict(vocabulary_size=32000, num_layers=16, num_query_heads=32, num_key_value_heads=8, hidden_dim=2048,
               intermediate_dim=8192),
}


def rss() -> dict[str, int]:
  """VmRSS and VmHWM (peak) of this process, bytes."""
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      key, _, value = line.partition(":")
      if key in ("VmRSS", "VmHWM"):
        out[key] = int(value.split()[0]) * 1024
  return out


def reset_peak() -> None:
  """Sets VmHWM back to the current RSS (Linux: `5` in /proc/self/clear_refs)."""
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")


class Phase:
  """Times a phase and records its peak RSS above the RSS it started from."""

  def __init__(self, results: dict, name: str):
    self.results, self.name = results, name

  def __enter__(self):
    import gc
    gc.collect()
    reset_peak()
    self.start_rss = rss()["VmRSS"]
    self.start = time.perf_counter()
    return self

  def __exit__(self, *exc):
    self.results[self.name + "_s"] = time.perf_counter() - self.start
    self.results[self.name + "_peak"] = rss()["VmHWM"] - self.start_rss
    self.results[self.name + "_start_rss"] = self.start_rss


def _steady(fn, repeats: int = 5) -> float:
  sys.path.insert(0, str(HERE))
  from _timing import block
  block(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    block(fn())
    times.append(time.perf_counter() - start)
  return sorted(times)[len(times) // 2]


def _inputs(np):
  return {"token_ids": np.ones((1, SEQ), np.int32), "padding_mask": np.ones((1, SEQ), np.int32)}


def worker_jaxport(size: str, path: str) -> dict:
  os.environ["KERAS_BACKEND"] = "tensorflow"
  import numpy as np
  r: dict = {"baseline_rss": rss()["VmRSS"]}
  import keras_hub
  import tensorflow as tf

  import jaxport
  r["imports_rss"] = rss()["VmRSS"]
  with Phase(r, "tf"):
    model = keras_hub.models.LlamaBackbone(**SIZES[size], dtype="float32")
    model(_inputs(np))
  r["weights"] = int(sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights))
  r["params"] = int(model.count_params())
  specs = {k: tf.TensorSpec((1, SEQ), tf.int32) for k in ("token_ids", "padding_mask")}
  import jax
  start_rss = rss()["VmRSS"]   # what TF holds for the model
  with Phase(r, "convert"):
    jax_fn, params = jaxport.convert(model, specs)
  run = jax.jit(jax_fn.outputs_only)
  x = _inputs(np)
  with Phase(r, "first_call"):
    jax.block_until_ready(run(params, x))
  r["run_s"] = _steady(lambda: run(params, x))
  with Phase(r, "export"):
    jaxport.export(jax_fn, params, x, path=path, platforms=("cpu",))
  # the highest RSS of the three phases, above what TF held before the convert
  r["convert_export_peak"] = max(r[p + "_peak"] + r[p + "_start_rss"] for p in ("convert", "first_call", "export")
                                 ) - start_rss
  return r


def worker_load(size: str, path: str, sharding: str | None) -> dict:
  sys.modules["tensorflow"] = None   # no TF: a load must not need it
  import jax
  import numpy as np

  import jaxport
  r: dict = {}
  with Phase(r, "load"):
    fn, params = jaxport.load(path, sharding=sharding)
  run = jax.jit(fn.outputs_only)
  x = _inputs(np)
  with Phase(r, "first_call"):
    jax.block_until_ready(run(params, x))
  r["run_s"] = _steady(lambda: run(params, x))
  r["devices"] = len(jax.devices())
  return r


def worker_keras_jax(size: str) -> dict:
  os.environ["KERAS_BACKEND"] = "jax"
  import jax
  import keras_hub
  import numpy as np
  r: dict = {"imports_rss": rss()["VmRSS"]}
  with Phase(r, "build"):
    model = keras_hub.models.LlamaBackbone(**SIZES[size], dtype="float32")
    variables = [v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables]
    run = jax.jit(lambda tv, ntv, x: model.stateless_call(tv, ntv, x)[0])
    x = _inputs(np)
    jax.block_until_ready(run(*variables, x))
  r["run_s"] = _steady(lambda: run(*variables, x))
  return r


def _spawn(args: list[str], env: dict | None = None) -> dict:
  with tempfile.NamedTemporaryFile(suffix=".json") as out:
    proc = subprocess.run([sys.executable, __file__, "--worker", *args, "--result", out.name],
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
                          capture_output=True, text=True)
    if proc.returncode:
      return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1][:160]}
    return json.loads(pathlib.Path(out.name).read_text())


def measure(size: str, others: bool) -> dict:
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "artifact")
    row = {"size": size, "jaxport": _spawn(["jaxport", size, path])}
    if "error" not in row["jaxport"]:
      row["load"] = _spawn(["load", size, path])
      row["load8"] = _spawn(["load8", size, path], {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
  if others:
    row["keras_jax"] = _spawn(["keras_jax", size])
  return row


def _top(r: dict, *phases: str) -> int | None:
  """The highest RSS of the process over `phases` (None when none ran)."""
  return max((r[p + "_peak"] + r[p + "_start_rss"] for p in phases if p + "_peak" in r), default=None)


def table(rows: list[dict]) -> str:
  """Peaks as multiples of the weights: of the whole process (imports included, as TF's ~0.9 GB), and
  above where the phase started (what TF held for the model; the imports for a load)."""
  head = ["size", "weights", "TF build+forward: process peak", "jaxport convert+run+export: process peak",
          "convert+export above TF (target <= 2)", "convert s", "export s", "jaxport.load: process peak",
          "load above imports (target <= 1.1)", "load, 8 devices fsdp, above imports", "load s",
          "first call after load s", "run s: converted / loaded / loaded 8 dev", "Keras 3 on JAX: process peak",
          "Keras 3 on JAX run s"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for row in rows:
    j = row["jaxport"]
    if "error" in j:
      lines.append(f"| {row['size']} | error: {j['error']} |" + " |" * (len(head) - 2))
      continue
    w = j["weights"]
    load, load8, kj = row.get("load", {}), row.get("load8", {}), row.get("keras_jax", {})
    x = lambda v: f"{v / w:.2f}x" if isinstance(v, (int, float)) else "-"   # noqa: E731
    s = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"   # noqa: E731
    cells = [f"{row['size']} ({j['params'] / 1e9:.2f}B)", f"{w / 2**20:.0f} MiB", x(_top(j, "tf")),
             x(_top(j, "tf", "convert", "first_call", "export")), x(j["convert_export_peak"]), s(j["convert_s"]),
             s(j["export_s"]), x(_top(load, "load", "first_call")), x(load.get("load_peak")),
             x(load8.get("load_peak")), s(load.get("load_s")), s(load.get("first_call_s")),
             f"{s(j['run_s'])} / {s(load.get('run_s'))} / {s(load8.get('run_s'))}", x(_top(kj, "build")),
             s(kj.get("run_s"))]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def plot(rows: list[dict], path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  rows = [r for r in rows if "error" not in r["jaxport"]]
  series = {"TF build+forward": lambda r: r["jaxport"]["tf_peak"],
            "jaxport convert+run+export (above TF)": lambda r: r["jaxport"]["convert_export_peak"],
            "jaxport.load": lambda r: r.get("load", {}).get("load_peak", np.nan),
            "jaxport.load, 8 devices fsdp": lambda r: r.get("load8", {}).get("load_peak", np.nan),
            "Keras 3 on JAX build+run": lambda r: r.get("keras_jax", {}).get("build_peak", np.nan)}
  x = np.arange(len(rows))
  fig, ax = plt.subplots(figsize=(8, 4.5))
  width = 0.8 / len(series)
  for i, (label, get) in enumerate(series.items()):
    ax.bar(x + (i - len(series) / 2 + 0.5) * width, [get(r) / r["jaxport"]["weights"] for r in rows], width,
           label=label)
  ax.axhline(2.0, color="k", lw=0.8, ls="--", label="target: convert+export <= 2x")
  ax.axhline(1.1, color="gray", lw=0.8, ls=":", label="target: load <= 1.1x")
  ax.set_xticks(x, [r["size"] for r in rows])
  ax.set_ylabel("peak RSS above start / weights")
  ax.legend(fontsize=7)
  fig.suptitle("Peak memory per phase, Llama-style backbones (float32)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--sizes", default="0.1B,0.4B,1B")
  parser.add_argument("--no-others", action="store_true", help="skip Keras 3 on JAX")
  parser.add_argument("--out", default=str(HERE / "out"))
  parser.add_argument("--worker", nargs="+")
  parser.add_argument("--result")
  args = parser.parse_args()
  if args.worker:
    kind, size, *rest = args.worker
    result = {"jaxport": lambda: worker_jaxport(size, rest[0]), "load": lambda: worker_load(size, rest[0], None),
              "load8": lambda: worker_load(size, rest[0], "fsdp"), "keras_jax": lambda: worker_keras_jax(size)}[kind]()
    pathlib.Path(args.result).write_text(json.dumps(result))
    return
  try:
    import tf2jax  # noqa: F401
    print("tf2jax is installed but not measured here", file=sys.stderr)
  except ImportError:
    print("tf2jax is not installed: no tf2jax column", file=sys.stderr)
  rows = []
  for size in args.sizes.split(","):
    rows.append(measure(size, not args.no_others))
    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
  print(table(rows))
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  plot(rows, out / "scale_bench.png")
  print(f"plot written to {out / 'scale_bench.png'}")


if __name__ == "__main__":
  main()
