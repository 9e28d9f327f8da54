"""Artifact benchmark: conversion, `jaxport.export`, artifact size and `jaxport.load` per corpus model.

The corpus of the test suite: the keras-hub backbones of tests/convert/test_corpus_keras_hub.py (tiny
configs, random weights), the Keras applications of tests/convert/test_keras_models.py (their small
input sizes, batch 2) and the jax2tf programs of tests/convert/test_jax2tf_roundtrip.py; plus the two
cases of the export-time issue (`issue:`): Keras EfficientNetB0 at 224x224, batch 64, and the keras-hub
EfficientNet backbone at 224x224. Per model: `jaxport.convert` seconds (model already built),
`jaxport.export` seconds (default platforms cpu,cuda; it writes the params while the function lowers),
each the best of `--repeat` runs after a warm-up export of a tiny function, and its ratio to conversion (target: at most 2), with `artifact.lower` (trace and lowering) and writing
the files timed apart, the function and params files in MB, and `jaxport.load` seconds. Prints a markdown table and writes benchmarks/out/artifact_bench.png.
Nothing downloads.

  python benchmarks/artifact_bench.py [--models bert,ResNet50,jax2tf:lstm_scan] [--platforms cpu,cuda]
                                      [--vjp-order 0] [--repeat 3]

`--models` takes names or `family:name` (families: keras_hub, keras_app, jax2tf, issue), or a family alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

HERE = pathlib.Path(__file__).parent
TESTS = HERE.parent / "tests"
sys.path[:0] = [str(HERE), str(TESTS), str(TESTS / "convert")]
TARGET = 2.0   # export seconds per conversion second, at most


@dataclasses.dataclass
class Row:
  family: str
  name: str
  convert_s: float
  export_s: float                # jaxport.export: the params written while the function lowers
  lower_s: float                 # artifact.lower alone: trace + jax.export lowering
  write_s: float                 # LoweredArtifact.write alone: serialize, hash and write the files
  function_mb: float
  params_mb: float
  load_s: float
  error: str = ""

  @property
  def ratio(self) -> float:
    return self.export_s / self.convert_s if self.convert_s else float("nan")


def corpus() -> dict[tuple[str, str], object]:
  """(family, name) -> a builder returning (model or tf.function, example args) to convert."""
  import numpy as np
  entries = {}
  import test_corpus_keras_hub as hub   # noqa: the test module's builders, not its tests
  for name, build in hub.CORPUS.items():
    entries[("keras_hub", name)] = lambda build=build: _hub_model(hub, build)
  import test_keras_models as apps
  for name in sorted(apps.APPLICATIONS):
    entries[("keras_app", name)] = lambda name=name: (lambda m, x: (m, (x,)))(*apps._application(name))
  try:
    import test_jax2tf_roundtrip as roundtrip
  except BaseException:   # pytest.importorskip without flax: no jax2tf rows
    roundtrip = None
  for name in (roundtrip.CASES if roundtrip else []):
    entries[("jax2tf", name)] = lambda name=name: (lambda p: (p[1], tuple(p[3])))(roundtrip._program(name))

  def efficientnet_b0():
    import keras
    keras.utils.set_random_seed(0)
    model = keras.applications.EfficientNetB0(weights=None, input_shape=(224, 224, 3), classes=1000)
    return model, (np.random.RandomState(0).uniform(0, 255, (64, 224, 224, 3)).astype(np.float32),)

  def hub_efficientnet_224():   # the corpus config at 224x224
    import keras
    keras.utils.set_random_seed(0)
    model = hub.hub.EfficientNetBackbone(
        stackwise_width_coefficients=[1.0] * 2, stackwise_depth_coefficients=[1.0] * 2,
        stackwise_kernel_sizes=[3, 3], stackwise_num_repeats=[1, 1], stackwise_input_filters=[8, 8],
        stackwise_output_filters=[8, 16], stackwise_expansion_ratios=[1, 4],
        stackwise_squeeze_and_excite_ratios=[0.0, 0.25], stackwise_strides=[1, 2],
        stackwise_block_types=["fused", "unfused"], num_features=32, input_shape=(224, 224, 3))
    return model, (np.random.RandomState(0).uniform(-1, 1, (2, 224, 224, 3)).astype(np.float32),)
  entries[("issue", "EfficientNetB0 224px b64")] = efficientnet_b0
  entries[("issue", "keras-hub efficientnet 224px")] = hub_efficientnet_224
  return entries


def _hub_model(hub, build):
  import keras
  keras.utils.set_random_seed(0)
  built = build()
  model, inputs = built if isinstance(built, tuple) else (built, hub._fill(built))
  return model, (inputs,)


def selected(entries, spec: str | None):
  if not spec:
    return list(entries)
  wanted = [w.strip() for w in spec.split(",") if w.strip()]
  keys = [k for k in entries if any(w in (k[0], k[1], f"{k[0]}:{k[1]}") for w in wanted)]
  unknown = [w for w in wanted if not any(w in (k[0], k[1], f"{k[0]}:{k[1]}") for k in entries)]
  if unknown:
    raise SystemExit(f"--models: unknown {', '.join(unknown)}; pick from {', '.join(f'{f}:{n}' for f, n in entries)}")
  return keys


def measure(family: str, name: str, build, platforms, vjp_order: int, repeat: int) -> Row:
  """The best of `repeat` conversions (each of a newly built model: a second conversion of the same one
  reuses TF's traced graph; and each decoding its XlaCallModule modules, as a user's one conversion does) and of `repeat` exports (each into a new directory): noise on a shared machine
  only adds time (writeback stalls made one VGG16 export take 0.43 s, the next 0.15 s)."""
  import jaxport
  from jaxport import artifact
  from jaxport.convert.ops import xla_call_module
  convert_times, export_times = [], []
  for _ in range(repeat):
    model, args = build()
    xla_call_module.clear_module_cache()   # nor the StableHLO modules decoded by the previous conversion
    gc.collect()   # not during the timed stages
    start = time.perf_counter()
    jax_fn, params = jaxport.convert(model, *args)
    convert_times.append(time.perf_counter() - start)
  for _ in range(repeat):
    with tempfile.TemporaryDirectory(prefix="artifact_bench_") as tmp:
      gc.collect()
      start = time.perf_counter()
      jaxport.export(jax_fn, params, *args, path=tmp, platforms=platforms, vjp_order=vjp_order)
      export_times.append(time.perf_counter() - start)
  with tempfile.TemporaryDirectory(prefix="artifact_bench_") as tmp:
    # The two stages apart, for where the time goes (export overlaps them).
    start = time.perf_counter()
    lowered = artifact.lower(jax_fn, params, *args, platforms=platforms, vjp_order=vjp_order)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    lowered.write(tmp)
    write_s = time.perf_counter() - start
    sizes = {f: os.path.getsize(os.path.join(tmp, f)) / 1e6 for f in (artifact.FUNCTION_FILE, artifact.PARAMS_FILE)}
    start = time.perf_counter()
    jaxport.load(tmp)
    load_s = time.perf_counter() - start
  return Row(family, name, min(convert_times), min(export_times), lower_s, write_s, sizes[artifact.FUNCTION_FILE],
             sizes[artifact.PARAMS_FILE], load_s)


def warm_up(platforms) -> None:
  """Converts and exports a tiny function, so the first model's row carries no import of TF's or JAX's
  lowering modules (jaxlib's MLIR dialects alone took 0.25 s of the first export)."""
  import tensorflow as tf
  import jaxport
  fn = tf.function(lambda x: tf.nn.relu(x) * 2.0)
  x = tf.ones((2, 3))
  jax_fn, params = jaxport.convert(fn, x)
  with tempfile.TemporaryDirectory(prefix="artifact_bench_") as tmp:
    jaxport.export(jax_fn, params, x, path=tmp, platforms=platforms)


def table(rows: list[Row]) -> str:
  lines = ["| family | model | convert s | export s (lower, write apart) | export / convert | function MB | params MB | "
           "load s |", "|---|---|---:|---:|---:|---:|---:|---:|"]
  for r in rows:
    if r.error:
      lines.append(f"| {r.family} | {r.name} | failed: {r.error} | | | | | |")
      continue
    flag = "" if r.ratio <= TARGET else " **over**"
    lines.append(f"| {r.family} | {r.name} | {r.convert_s:.2f} | {r.export_s:.2f} ({r.lower_s:.2f}, "
                 f"{r.write_s:.2f}) | {r.ratio:.2f}{flag} | "
                 f"{r.function_mb:.2f} | {r.params_mb:.2f} | {r.load_s:.2f} |")
  return "\n".join(lines)


def plot(rows: list[Row], path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  rows = [r for r in rows if not r.error]
  x = np.arange(len(rows))
  fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(max(8, 0.32 * len(rows)), 7), sharex=True)
  ax1.bar(x - 0.2, [r.convert_s for r in rows], 0.4, label="jaxport.convert")
  ax1.bar(x + 0.2, [r.export_s for r in rows], 0.4, label="jaxport.export")
  ax1.set_yscale("log")
  ax1.set_ylabel("seconds")
  ax1.legend()
  ax2.bar(x, [r.ratio for r in rows], color=["C0" if r.ratio <= TARGET else "C3" for r in rows])
  ax2.axhline(TARGET, color="k", lw=0.8, ls="--", label=f"target: export <= {TARGET:g}x convert")
  ax2.set_ylabel("export / convert")
  ax2.legend()
  ax2.set_xticks(x, [r.name for r in rows], rotation=75, fontsize=7)
  fig.suptitle("jaxport.export vs jaxport.convert per corpus model")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--models", help="comma-separated names, family:name or families (default: all)")
  parser.add_argument("--platforms", default="cpu,cuda", help="platforms to export for (default: cpu,cuda)")
  parser.add_argument("--vjp-order", type=int, default=0, help="jaxport.export's vjp_order (default: 0)")
  parser.add_argument("--repeat", type=int, default=3,
                      help="conversions and exports per model; the table has the best of each (default: 3)")
  parser.add_argument("--out", default=str(HERE / "out"))
  args = parser.parse_args()
  import warnings
  warnings.filterwarnings("ignore", module="keras.*")
  entries = corpus()
  platforms = tuple(p for p in args.platforms.split(",") if p)
  warm_up(platforms)
  rows = []
  for key in selected(entries, args.models):
    try:
      row = measure(*key, entries[key], platforms, args.vjp_order, max(1, args.repeat))
    except Exception as e:   # one model failing does not stop the table
      row = Row(*key, *(float("nan"),) * 7, error=f"{type(e).__name__}: {str(e).splitlines()[0][:80]}")
    rows.append(row)
    print(f"{key[0]}:{key[1]}: convert {row.convert_s:.2f} s, export {row.export_s:.2f} s"
          + (f" ({row.error})" if row.error else ""), file=sys.stderr, flush=True)
  print(table(rows))
  over = [f"{r.family}:{r.name} ({r.ratio:.1f}x)" for r in rows if not r.error and r.ratio > TARGET]
  print(f"\nexport <= {TARGET:g}x convert: {len(rows) - len(over)} of {len(rows)} models"
        + (f"; over: {', '.join(over)}" if over else ""))
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  plot(rows, out / "artifact_bench.png")
  print(f"plot written to {out / 'artifact_bench.png'}")


if __name__ == "__main__":
  main()
