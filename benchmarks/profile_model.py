"""Where the time goes in one model: jaxport vs Keras-on-JAX vs TF graph, on CPU.

For the JAX routes it prints a histogram of the compiled (optimised) HLO (convolutions,
dots, transposes, copies, fusion kinds, reduce-windows, ...), the time per HLO op kind
from a `jax.profiler` trace (XLA:CPU names one event per thunk), and how many threads
ran thunks. For TF it prints the oneDNN primitives that ran (`ONEDNN_VERBOSE=1`, in a
subprocess) with their times. Steady-state times are measured interleaved (A, B, C, A,
B, C, ...) in one process, medians.

Keras-on-JAX runs in a subprocess (`KERAS_BACKEND=jax`) on the same weights (saved
with `save_weights`); it compiles and times the model there, then exports the jitted
`stateless_call` with `jax.export` (weights as arguments, not constants) so this process
can time it interleaved with jaxport.

  python benchmarks/profile_model.py VGG16 [--batch 2] [--routes jaxport,keras,tf]
      [--repeats 10] [--dump DIR] [--no-trace] [--onednn] [--tf-xla]
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import interleaved, timed  # noqa: E402

SIZES = {"InceptionV3": 299, "Xception": 299, "InceptionResNetV2": 299, "NASNetLarge": 331}


def build(name: str, batch: int):
  import keras
  keras.utils.set_random_seed(0)
  size = SIZES.get(name, 224)
  model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3))
  x = np.random.RandomState(0).uniform(0, 255, size=(batch, size, size, 3)).astype(np.float32)
  return model, x


# --------------------------------------------------------------------------- HLO histogram

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = (?:\([^=]*?\)|\S+) ([a-z][\w\-]*)\((.*)$")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_KIND = re.compile(r"kind=(k\w+)")
_CUSTOM = re.compile(r'custom_call_target="([^"]+)"')


def parse_hlo(text: str) -> dict[str, dict]:
  """Instruction name -> {op, comp, kind}: `op` is the opcode, with the fusion kind or custom target."""
  instrs, comp = {}, None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m and " = " not in line:
      comp = "ENTRY" if m.group(1) else m.group(2)
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    name, op, rest = m.groups()
    label = op
    if op == "fusion":
      kind = _KIND.search(rest)
      label = f"fusion:{kind.group(1) if kind else '?'}"
    elif op == "custom-call":
      target = _CUSTOM.search(rest)
      label = f"custom-call:{target.group(1) if target else '?'}"
    instrs[name] = {"op": label, "comp": comp, "line": line.strip()}
  return instrs


def histogram(instrs: dict[str, dict]) -> dict[str, collections.Counter]:
  """Counts of opcodes in the entry computation, inside fusions, and over all computations."""
  entry = collections.Counter(i["op"] for i in instrs.values() if i["comp"] == "ENTRY")
  inner = collections.Counter(i["op"] for i in instrs.values() if i["comp"] != "ENTRY")
  return {"entry": entry, "inside": inner}


_KEY_OPS = ("convolution", "dot", "transpose", "copy", "reduce-window", "concatenate", "pad", "slice",
            "reshape", "broadcast", "reduce", "select-and-scatter", "constant", "parameter", "call")


def key_counts(instrs) -> dict[str, int]:
  """Opcode counts over the whole module (fusions included), for the ops that tell lowerings apart."""
  counts = collections.Counter(i["op"].split(":")[0] for i in instrs.values())
  return {op: counts.get(op, 0) for op in _KEY_OPS} | {"fusion": counts.get("fusion", 0),
                                                       "total": sum(counts.values())}


# --------------------------------------------------------------------------- per-op time


def trace_times(call, instrs, repeats: int) -> tuple[dict[str, float], dict]:
  """Seconds per call per op kind, from XLA:CPU's per-thunk trace events; and thread usage."""
  import jax
  tmp = tempfile.mkdtemp(prefix="jaxtrace")
  call()
  jax.profiler.start_trace(tmp, create_perfetto_trace=True)
  start = time.perf_counter()
  for _ in range(repeats):
    call()
  wall = time.perf_counter() - start
  jax.profiler.stop_trace()
  (path,) = glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True)
  events = json.load(gzip.open(path))
  events = events["traceEvents"] if isinstance(events, dict) else events
  per_kind: dict[str, float] = collections.defaultdict(float)
  busy: dict = collections.defaultdict(float)
  for e in events:
    if e.get("ph") != "X" or e.get("name") not in instrs:
      continue
    per_kind[instrs[e["name"]]["op"]] += e["dur"] * 1e-6 / repeats
    busy[e.get("tid")] += e["dur"] * 1e-6
  threads = {"threads": len(busy), "busy_s": sum(busy.values()) / repeats, "wall_s": wall / repeats}
  return dict(per_kind), threads


# --------------------------------------------------------------------------- routes


class _Clock:
  """Wall and process CPU seconds of a block (CPU time is the steadier number on a shared machine)."""

  def __enter__(self):
    self.wall, self.cpu = time.perf_counter(), time.process_time()
    return self

  def __exit__(self, *exc):
    self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def jaxport_route(model, x):
  import jax
  import jaxport
  with _Clock() as convert:
    jax_fn, params = jaxport.convert(model, x)
  params = jax.device_put(params)
  jitted = jax.jit(lambda p, x: jax_fn(p, x)[0])
  with _Clock() as lower:
    lowered = jitted.lower(params, x)
  with _Clock() as compile_:
    compiled = lowered.compile()
  info = {"convert_s": convert.wall, "lower_s": lower.wall, "compile_s": compile_.wall,
          "convert_cpu_s": convert.cpu, "lower_cpu_s": lower.cpu, "compile_cpu_s": compile_.cpu,
          "stablehlo_ops": _count_stablehlo(lowered.as_text())}
  return compiled, (params, x), info


def _count_stablehlo(text: str) -> int:
  return sum(1 for line in text.splitlines() if " = " in line and ("stablehlo." in line or "call @" in line))


def keras_export_child(name: str, batch: int, weights: str, out: str) -> None:
  """(In a KERAS_BACKEND=jax process.) Compiles and exports the model's jitted stateless_call."""
  import jax
  model, x = build(name, batch)
  model.load_weights(weights)
  tv = [v.value for v in model.trainable_variables]
  ntv = [v.value for v in model.non_trainable_variables]
  jitted = jax.jit(lambda tv, ntv, x: model.stateless_call(tv, ntv, x, training=False)[0])
  with _Clock() as lower:
    lowered = jitted.lower(tv, ntv, x)
  with _Clock() as compile_:
    compiled = lowered.compile()
  run = lambda: compiled(tv, ntv, x).block_until_ready()
  run()
  times = []
  for _ in range(5):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  exported = jax.export.export(jitted)(tv, ntv, x)
  with open(os.path.join(out, "keras.bin"), "wb") as f:
    f.write(exported.serialize())
  np.savez(os.path.join(out, "keras_vars.npz"), *[np.asarray(v) for v in tv + ntv])
  with open(os.path.join(out, "keras.json"), "w") as f:
    json.dump({"lower_s": lower.wall, "compile_s": compile_.wall, "lower_cpu_s": lower.cpu,
               "compile_cpu_s": compile_.cpu, "run_s_in_child": statistics.median(times),
               "n_tv": len(tv), "stablehlo_ops": _count_stablehlo(lowered.as_text())}, f)


def keras_route(model, name: str, batch: int, x):
  """Runs the Keras-on-JAX child and compiles its export here."""
  import jax
  tmp = tempfile.mkdtemp(prefix="kerasjax")
  weights = os.path.join(tmp, "model.weights.h5")
  model.save_weights(weights)
  env = {**os.environ, "KERAS_BACKEND": "jax"}
  subprocess.run([sys.executable, __file__, name, "--batch", str(batch), "--route", "keras_child",
                  "--emit", tmp], env=env, check=True)
  with open(os.path.join(tmp, "keras.bin"), "rb") as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  info = json.load(open(os.path.join(tmp, "keras.json")))
  arrays = np.load(os.path.join(tmp, "keras_vars.npz"))
  values = [jax.device_put(arrays[f"arr_{i}"]) for i in range(len(arrays.files))]
  args = (values[:info["n_tv"]], values[info["n_tv"]:], x)
  compiled = jax.jit(exported.call).lower(*args).compile()
  return compiled, args, info


def onednn_child(name: str, batch: int) -> None:
  """(In an ONEDNN_VERBOSE=1 process.) Runs the TF graph; the parent reads the verbose lines."""
  import tensorflow as tf
  model, x = build(name, batch)
  fn = tf.function(lambda t: model(t, training=False))
  x = tf.constant(x)
  fn(x)
  fn(x)
  print("=== MEASURED CALL ===", flush=True)
  fn(x)


def onednn_table(name: str, batch: int):
  env = {**os.environ, "ONEDNN_VERBOSE": "1", "TF_ENABLE_ONEDNN_OPTS": "1"}
  out = subprocess.run([sys.executable, __file__, name, "--batch", str(batch), "--route", "onednn_child"],
                       env=env, check=True, capture_output=True, text=True).stdout
  out = out.split("=== MEASURED CALL ===", 1)[-1]
  table = collections.defaultdict(lambda: [0, 0.0])
  for line in out.splitlines():
    parts = line.split(",")
    if not line.startswith("onednn_verbose") or "exec" not in parts:
      continue
    i = parts.index("exec")
    kind, impl = parts[i + 2], parts[i + 3]
    table[f"{kind} {impl}"][0] += 1
    table[f"{kind} {impl}"][1] += float(parts[-1]) * 1e-3
  return dict(table)


# --------------------------------------------------------------------------- main


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("model")
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--routes", default="jaxport,keras,tf")
  parser.add_argument("--route", default=None, help=argparse.SUPPRESS)   # child processes
  parser.add_argument("--emit", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--dump", default=None, help="write the optimised HLO of each JAX route here")
  parser.add_argument("--no-trace", action="store_true", help="skip the per-op profiler trace")
  parser.add_argument("--onednn", action="store_true", help="list TF's oneDNN primitives (subprocess)")
  parser.add_argument("--tf-xla", action="store_true", help="also time TF XLA's compile (jit_compile=True)")
  parser.add_argument("--json", default=None, help="write the results here")
  args = parser.parse_args()
  if args.route == "keras_child":
    return keras_export_child(args.model, args.batch, os.path.join(args.emit, "model.weights.h5"), args.emit)
  if args.route == "onednn_child":
    return onednn_child(args.model, args.batch)

  import jax
  routes = args.routes.split(",")
  model, x = build(args.model, args.batch)
  compiled, infos, calls = {}, {}, {}
  if "jaxport" in routes:
    compiled["jaxport"], jargs, infos["jaxport"] = jaxport_route(model, x)
    calls["jaxport"] = lambda: jax.block_until_ready(compiled["jaxport"](*jargs))
  if "keras" in routes:
    compiled["keras"], kargs, infos["keras"] = keras_route(model, args.model, args.batch, x)
    calls["keras"] = lambda: jax.block_until_ready(compiled["keras"](*kargs))
  if "tf" in routes:
    import tensorflow as tf
    tf_fn = tf.function(lambda t: model(t, training=False))
    tx = tf.constant(x)
    calls["tf"] = lambda: tf_fn(tx).numpy()
  result = {"model": args.model, "batch": args.batch, "info": infos}
  if "jaxport" in calls and "keras" in calls:
    result["max_abs_diff_vs_keras"] = float(np.max(np.abs(np.asarray(calls["jaxport"]()) - np.asarray(calls["keras"]()))))
  if "jaxport" in calls and "tf" in calls:
    result["max_abs_diff_vs_tf"] = float(np.max(np.abs(np.asarray(calls["jaxport"]()) - calls["tf"]())))
  result["run_ms"] = {k: v * 1e3 for k, v in interleaved({k: timed(fn) for k, fn in calls.items()}, args.repeats).items()}
  print(f"\n== {args.model}, batch {args.batch}: steady state, interleaved medians of {args.repeats} ==")
  for k, v in result["run_ms"].items():
    print(f"  {k:8s} {v:9.1f} ms")
  for k in ("max_abs_diff_vs_keras", "max_abs_diff_vs_tf"):
    if k in result:
      print(f"  {k}: {result[k]:.2e}")
  for k, info in infos.items():
    print(f"  {k} compile: " + ", ".join(f"{a}={b:.2f}" if isinstance(b, float) else f"{a}={b}"
                                         for a, b in info.items()))

  hists = {}
  for k, exe in compiled.items():
    text = exe.as_text()
    if args.dump:
      os.makedirs(args.dump, exist_ok=True)
      with open(os.path.join(args.dump, f"{args.model}_{k}.hlo.txt"), "w") as f:
        f.write(text)
    instrs = parse_hlo(text)
    hists[k] = (instrs, histogram(instrs), key_counts(instrs))
  if hists:
    names = list(hists)
    print("\n== optimised HLO, whole module (fusion bodies included) ==")
    print(f"  {'op':22s}" + "".join(f"{n:>10s}" for n in names))
    for op in hists[names[0]][2]:
      print(f"  {op:22s}" + "".join(f"{hists[n][2][op]:10d}" for n in names))
    print("\n== entry computation (what runs as thunks) ==")
    ops = sorted(set().union(*(h[1]["entry"] for h in hists.values())))
    for op in ops:
      print(f"  {op:40s}" + "".join(f"{hists[n][1]['entry'].get(op, 0):10d}" for n in names))
    result["hlo"] = {n: {"whole": h[2], "entry": dict(h[1]["entry"])} for n, h in hists.items()}

  if not args.no_trace and hists:
    print("\n== time per call by entry op kind (profiler trace, ms; thunks may overlap) ==")
    per = {}
    for k in hists:
      per[k] = trace_times(calls[k], hists[k][0], max(3, args.repeats // 2))
    ops = sorted(set().union(*(p[0] for p in per.values())), key=lambda o: -max(p[0].get(o, 0) for p in per.values()))
    print(f"  {'op':40s}" + "".join(f"{n:>10s}" for n in per))
    for op in ops:
      print(f"  {op:40s}" + "".join(f"{per[n][0].get(op, 0) * 1e3:10.1f}" for n in per))
    for n, (_, threads) in per.items():
      print(f"  {n}: {threads['threads']} threads ran thunks; busy {threads['busy_s'] * 1e3:.1f} ms per "
            f"{threads['wall_s'] * 1e3:.1f} ms call (mean concurrency {threads['busy_s'] / threads['wall_s']:.2f})")
    result["trace_ms"] = {n: {op: t * 1e3 for op, t in p[0].items()} for n, p in per.items()}

  if args.onednn:
    table = onednn_table(args.model, args.batch)
    print("\n== TF graph: oneDNN primitives in one call (ONEDNN_VERBOSE) ==")
    for key, (count, secs) in sorted(table.items(), key=lambda kv: -kv[1][1]):
      print(f"  {key:50s} {count:5d} {secs * 1e3:9.1f} ms")
    result["onednn"] = table
  if args.tf_xla:
    import tensorflow as tf
    xla_fn = tf.function(lambda t: model(t, training=False), jit_compile=True)
    tx = tf.constant(x)
    with _Clock() as first:
      xla_fn(tx).numpy()
    with _Clock() as run:
      xla_fn(tx).numpy()
    result["tf_xla_compile_s"], result["tf_xla_compile_cpu_s"] = first.wall - run.wall, first.cpu - run.cpu
    print(f"\n  TF XLA compile (first call - second): {first.wall - run.wall:.2f} s wall, "
          f"{first.cpu - run.cpu:.2f} s CPU")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=1, default=str)


if __name__ == "__main__":
  main()
