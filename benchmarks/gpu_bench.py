"""jaxport artifacts vs Keras 3 on JAX, on a GPU machine that has no TensorFlow (issue 20's GPU table).

Three steps, the first two on the CPU machine (which has TensorFlow), the last on the device:

  python benchmarks/gpu_bench.py prepare [--out benchmarks/gpu_artifacts] [--tiny]
      builds each model with Keras 3 (TF backend, random weights), converts it with jaxport and exports
      an artifact for cpu and cuda, in float32 and bfloat16 (Keras dtype policy); the params files are
      dropped (BERT-base alone is 440 MB): the device writes them from the Keras model it builds
  python benchmarks/gpu_bench.py wheels [--out benchmarks/gpu_wheels]
      downloads what the device lacks for its Python (3.12): Keras, KerasHub, safetensors and their
      small dependencies, and builds jaxport's own wheel
  python benchmarks/gpu_bench.py run [--artifacts benchmarks/gpu_artifacts] [--repeats 30] [--out DIR]
      on the device, both folders carried (git ignores them; about 20 MB), e.g.
        pip install -q --no-index --find-links benchmarks/gpu_wheels keras keras-hub safetensors rich \
          dm-tree && PYTHONPATH=src python benchmarks/gpu_bench.py run --out $OUT
      per model and dtype, the model built by Keras 3 on its JAX backend and the loaded
      artifact (`jaxport.load`) given that model's weights, each under `jax.jit`, timed interleaved
      (medians of --repeats), their outputs compared; prints the table and writes gpu_bench.json to
      --out. TensorFlow is never imported.

The models and sizes are the issue's: BERT-base (batch 16, seq 512), GPT-2 small (8 x 512), ViT-B/16
(batch 32), ResNet50 and EfficientNetB0 (batch 64); `--tiny` builds the same architectures at toy sizes,
which is how the suite runs `prepare` and `run` on a CPU (tests/test_gpu_bench.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

HERE = pathlib.Path(__file__).parent
DTYPES = ("float32", "bfloat16")
# What `wheels` downloads for the device (its Python has jax, numpy, torch and CuPy, but not these). Keras
# and KerasHub are pinned to what `prepare` built with (the params are matched by Keras's variable paths).
DEVICE_WHEELS = ("keras==3.15.1", "keras-hub==0.32.0", "safetensors", "h5py", "optree", "namex", "rich", "absl-py",
                 "ml_dtypes", "dm-tree", "regex", "packaging", "markdown-it-py", "mdurl", "pygments", "kagglehub",
                 "kagglesdk", "requests", "tqdm", "pyyaml", "urllib3", "idna", "certifi", "charset-normalizer",
                 "protobuf", "typing_extensions", "attrs", "wrapt")
_DEVICE_PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64")


@dataclasses.dataclass(frozen=True)
class Spec:
  name: str
  batch: int
  seq: int = 0          # text models: tokens per example
  image: int = 0        # image models: height = width


def specs(tiny: bool) -> list[Spec]:
  if tiny:
    return [Spec("bert", 2, seq=16), Spec("gpt2", 2, seq=16), Spec("vit", 2, image=32), Spec("resnet50", 2, image=32),
            Spec("efficientnetb0", 2, image=32)]
  return [Spec("bert", 16, seq=512), Spec("gpt2", 8, seq=512), Spec("vit", 32, image=224),
          Spec("resnet50", 64, image=224), Spec("efficientnetb0", 64, image=224)]


def build(spec: Spec, tiny: bool):
  """The Keras model of `spec` with seeded random weights (the same code on the TF and JAX backends)."""
  import keras
  keras.utils.set_random_seed(0)
  if spec.name in ("bert", "gpt2", "vit"):
    import keras_hub as hub
    size = (dict(num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64) if tiny else
            dict(num_layers=12, num_heads=12, hidden_dim=768, intermediate_dim=3072))
    if spec.name == "bert":
      return hub.models.BertBackbone(vocabulary_size=1000 if tiny else 30522, max_sequence_length=spec.seq, **size)
    if spec.name == "gpt2":
      return hub.models.GPT2Backbone(vocabulary_size=1000 if tiny else 50257, max_sequence_length=spec.seq, **size)
    mlp = size.pop("intermediate_dim")
    return hub.models.ViTBackbone(image_shape=(spec.image, spec.image, 3), patch_size=8 if tiny else 16,
                                  mlp_dim=mlp, **size)
  app = {"resnet50": keras.applications.ResNet50, "efficientnetb0": keras.applications.EfficientNetB0}[spec.name]
  return app(weights=None, input_shape=(spec.image, spec.image, 3), classifier_activation=None)


def example(spec: Spec):
  """The model's input for `spec` (text: a dict of token ids, padding mask and, for BERT, segment ids;
  images stay float32 under the bfloat16 policy: Keras casts them)."""
  rs = np.random.RandomState(0)
  if spec.seq:
    inputs = {"token_ids": rs.randint(1, 1000, size=(spec.batch, spec.seq)).astype(np.int32),
              "padding_mask": np.ones((spec.batch, spec.seq), np.int32)}
    if spec.name == "bert":
      inputs["segment_ids"] = np.zeros((spec.batch, spec.seq), np.int32)
    return inputs
  return rs.uniform(0, 1, size=(spec.batch, spec.image, spec.image, 3)).astype(np.float32)


def _set_policy(dtype: str) -> None:
  import keras
  keras.config.set_dtype_policy("float32" if dtype == "float32" else "bfloat16")


# --------------------------------------------------------------------------- prepare (CPU, TensorFlow)


def prepare(args) -> None:
  import jaxport
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  for spec in specs(args.tiny):
    for dtype in DTYPES:
      _set_policy(dtype)
      start = time.perf_counter()
      model = build(spec, args.tiny)
      x = example(spec)
      fn, params = jaxport.convert(model, x)
      path = out / f"{spec.name}_{dtype}"
      jaxport.export(fn, params, x, path=path, platforms=("cpu", "cuda"), batch_polymorphic=False)
      for name in os.listdir(path):
        if name.startswith("params"):   # the params files (and a shard index): regenerated on the device
          os.remove(path / name)
      print(f"{path.name}: converted and exported in {time.perf_counter() - start:.1f} s", flush=True)
  (out / "config.json").write_text(json.dumps({"tiny": args.tiny, "specs": [dataclasses.asdict(s) for s in
                                                                             specs(args.tiny)]}))


# --------------------------------------------------------------------------- wheels (CPU machine)


def wheels(args) -> None:
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  pip = [sys.executable, "-m", "pip"]
  platforms = [arg for tag in _DEVICE_PLATFORMS for arg in ("--platform", tag)]
  subprocess.run([*pip, "download", "--only-binary=:all:", "--no-deps", "--python-version", args.python, *platforms,
                  "-d", str(out), *DEVICE_WHEELS], check=True)
  subprocess.run([*pip, "wheel", "--no-deps", "-w", str(out), str(HERE.parent)], check=True)
  print(f"wheels in {out}: pip install --no-index --find-links {out} jaxport keras keras-hub")


# --------------------------------------------------------------------------- run (device, no TensorFlow)


def write_params(path: pathlib.Path, model) -> None:
  """Writes the artifact's params from the Keras model built on the device (the names are Keras's
  variable paths), so both systems run the same weights and their outputs can be compared."""
  from jaxport.artifact import _manifest as mf
  from jaxport.artifact._params import param_dtype, write_params as write
  weights = {v.path: np.asarray(v.value) for v in model.weights}
  names = [spec.path for spec in mf.read_manifest(str(path)).params]
  missing = [n for n in names if n not in weights]
  if missing:
    raise SystemExit(f"{path}: the Keras model has no variables {missing[:5]}: rerun `prepare` with this Keras")
  params = {n: weights[n] for n in names}
  write(str(path), params, {k: param_dtype(v) for k, v in params.items()}, None)


def _relative_error(actual, expected) -> float:
  import jax
  from jaxport.profiling import max_abs_error
  scale = max(float(np.max(np.abs(np.asarray(e, np.float32)))) for e in jax.tree.leaves(expected))
  return max_abs_error(actual, expected) / max(scale, 1e-30)


def run(args) -> None:
  import jax

  import jaxport
  from _timing import interleaved, timed

  config = json.loads((pathlib.Path(args.artifacts) / "config.json").read_text())
  device = jax.devices()[0]
  rows = []
  for spec in (Spec(**s) for s in config["specs"]):
    for dtype in DTYPES:
      path = pathlib.Path(args.artifacts) / f"{spec.name}_{dtype}"
      _set_policy(dtype)
      model = build(spec, config["tiny"])
      write_params(path, model)
      loaded, params = jaxport.load(path, verify=False)
      params, x = jax.device_put((dict(params), example(spec)))   # seeded: the inputs `prepare` exported with
      artifact = jax.jit(loaded.outputs_only)
      state = jax.device_put(([v.value for v in model.trainable_variables],
                              [v.value for v in model.non_trainable_variables]))
      keras_fn = jax.jit(lambda trainable, others, x: model.stateless_call(trainable, others, x)[0])
      first_s = {}
      for label, call in (("jaxport", lambda: artifact(params, x)), ("Keras JAX", lambda: keras_fn(*state, x))):
        start = time.perf_counter()
        jax.block_until_ready(call())
        first_s[label] = time.perf_counter() - start
      run_s = interleaved({"jaxport": timed(lambda: artifact(params, x)),
                           "Keras JAX": timed(lambda: keras_fn(*state, x))}, args.repeats)
      rows.append(dict(model=spec.name, dtype=dtype, batch=spec.batch, jaxport_ms=run_s["jaxport"] * 1e3,
                       keras_jax_ms=run_s["Keras JAX"] * 1e3, ratio=run_s["jaxport"] / run_s["Keras JAX"],
                       rel_err=_relative_error(artifact(params, x), keras_fn(*state, x)), first_call_s=first_s))
      print(f"{spec.name} {dtype}: jaxport {rows[-1]['jaxport_ms']:.2f} ms, Keras JAX "
            f"{rows[-1]['keras_jax_ms']:.2f} ms ({rows[-1]['ratio']:.2f}x), rel err {rows[-1]['rel_err']:.1e}",
            flush=True)
  print_table(rows, f"{device.platform.upper()}: {device.device_kind}", args.repeats)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "gpu_bench.json").write_text(json.dumps({"device": device.device_kind, "platform": device.platform,
                                                  "jax": jax.__version__, "rows": rows}, indent=1))


def print_table(rows: list[dict], device: str, repeats: int) -> None:
  print(f"\njaxport artifacts vs Keras 3 on JAX, {device}, jax.jit, medians of {repeats} (interleaved)")
  print("| model | batch | dtype | jaxport ms | Keras JAX ms | jaxport / Keras JAX | rel err |")
  print("|---|---:|---|---:|---:|---:|---:|")
  for r in rows:
    print(f"| {r['model']} | {r['batch']} | {r['dtype']} | {r['jaxport_ms']:.2f} | {r['keras_jax_ms']:.2f} | "
          f"{r['ratio']:.2f}x | {r['rel_err']:.1e} |")
  misses = [f"{r['model']}/{r['dtype']}" for r in rows if not r["ratio"] <= 1.0]
  print(("MISS" if misses else "PASS") + " jaxport <= Keras 3 on JAX" + (f" (missed: {', '.join(misses)})"
                                                                        if misses else ""))


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  steps = parser.add_subparsers(dest="step", required=True)
  p = steps.add_parser("prepare", help="CPU machine: export the artifacts (needs TensorFlow)")
  p.add_argument("--out", default=str(HERE / "gpu_artifacts"))
  p.add_argument("--tiny", action="store_true", help="toy sizes of the same architectures (CPU tests)")
  w = steps.add_parser("wheels", help="CPU machine: download the device's missing wheels")
  w.add_argument("--out", default=str(HERE / "gpu_wheels"))
  w.add_argument("--python", default="3.12", help="the device's Python version")
  r = steps.add_parser("run", help="device: time the artifacts against Keras 3 on JAX (no TensorFlow)")
  r.add_argument("--artifacts", default=str(HERE / "gpu_artifacts"))
  r.add_argument("--repeats", type=int, default=30)
  r.add_argument("--out", default=os.environ.get("OUT", str(HERE / "out")))
  args = parser.parse_args(argv)
  if args.step == "run":
    os.environ.setdefault("KERAS_BACKEND", "jax")
    sys.path.insert(0, str(HERE))
  {"prepare": prepare, "wheels": wheels, "run": run}[args.step](args)


if __name__ == "__main__":
  main()
