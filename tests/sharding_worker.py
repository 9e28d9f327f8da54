"""Subprocess side of tests/test_artifact_sharding.py: each mode prints one JSON line of facts to check.

  python tests/sharding_worker.py MODE ARTIFACT [ARGS...]

Modes run with TensorFlow blocked unless they convert (`convert8`); the caller sets XLA_FLAGS for
simulated devices.
"""
from __future__ import annotations

import json
import os
import sys

if sys.argv[1] != "convert8":
  sys.modules["tensorflow"] = None   # a load must not need TF: `import tensorflow` raises ImportError

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxport  # noqa: E402
from jaxport.artifact import _params  # noqa: E402


def vm(key: str) -> int:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def reset_peak() -> None:
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")


def full_params(path: str) -> dict[str, np.ndarray]:
  """Every param read whole from the files, to compare shards with."""
  _, params = jaxport.load(path)
  return {k: np.asarray(v) for k, v in params.items()}


def shard_facts(params: dict, full: dict) -> dict:
  """Per param: its spec, and whether each addressable shard holds the full array's slice there."""
  facts = {}
  for k, v in params.items():
    ok = all(np.array_equal(np.asarray(s.data), full[k][s.index]) for s in v.addressable_shards)
    shapes = sorted({tuple(s.data.shape) for s in v.addressable_shards})
    devices = sorted(s.device.id for s in v.addressable_shards)
    facts[k] = {"spec": list(v.sharding.spec) if hasattr(v.sharding, "spec") else None, "shards_match": ok,
                "shard_shapes": shapes, "devices": devices, "shape": list(v.shape)}
  return facts


def load8(path: str, inputs: str) -> dict:
  """8 devices in one process: fsdp load (memory), then rules and a dict, run under jit."""
  data = np.load(inputs)
  weights = sum(int(np.prod(s["shape"])) * np.dtype(s["dtype"]).itemsize
                for s in json.load(open(os.path.join(path, "jaxport.json")))["params"])
  reset_peak()
  start = vm("VmRSS")
  fn, params = jaxport.load(path, sharding="fsdp")
  peak = vm("VmHWM") - start
  out = jax.jit(fn.outputs_only)(params, data["x"])
  full = full_params(path)
  rules = [(r"kernel", jax.sharding.PartitionSpec(None, "fsdp"))]
  _, by_rules = jaxport.load(path, sharding=rules)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 4), ("data", "model"))
  by_name = {k: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()) for k in full}
  _, replicated = jaxport.load(path, sharding=by_name)
  # exported again from the sharded params (gathered to the host one file at a time): the same bytes
  again = os.path.join(os.path.dirname(path), "again")
  files = jaxport.export(fn, params, data["x"], path=again, platforms=("cpu",), max_shard_bytes=600_000)["files"]
  original = json.load(open(os.path.join(path, "jaxport.json")))["files"]
  same_params = set(files) == set(original) and all(files[k] == original[k] for k in original
                                                    if k != "function.jaxexport")
  return {"devices": len(jax.devices()), "weights": weights, "load_peak": peak, "reexport_same": same_params,
          "out_devices": len(out.sharding.device_set),
          "out_close": bool(np.allclose(np.asarray(out), data["y"], atol=1e-5, rtol=1e-5)),
          "out_spec": str(out.sharding.spec) if hasattr(out.sharding, "spec") else str(out.sharding),
          "fsdp": shard_facts(params, full), "rules": shard_facts(by_rules, full),
          "replicated": shard_facts(replicated, full), "tf_blocked": sys.modules.get("tensorflow") is None}


def synthetic(n: int = 16, rows: int = 1024, cols: int = 4096):
  """A plain JAX function over `n` float32 params of rows x cols (16 MiB each by default)."""
  rng = np.random.default_rng(0)
  params = {f"w{i}": rng.standard_normal((rows, cols), dtype=np.float32) for i in range(n)}

  def fn(params, x, rng=None):
    return sum((x @ w).sum(-1) for w in params.values()), params
  return fn, params


def export_memory(path: str) -> dict:
  """Export's peak above the RSS with the params built: the params streamed to the file, no blob."""
  fn, params = synthetic()
  x = np.ones((2, 1024), np.float32)
  jax.block_until_ready(fn(params, x))
  import gc
  gc.collect()
  reset_peak()
  start = vm("VmRSS")
  jaxport.export(fn, params, x, path=path, platforms=("cpu",), max_shard_bytes=100 << 20)
  return {"weights": sum(v.nbytes for v in params.values()), "export_peak": vm("VmHWM") - start}


def memory(path: str, placement: str) -> dict:
  """Load peak above the imports (backend up), one device: `numpy` params (then a first call's peak),
  or `device` (a SingleDeviceSharding)."""
  weights = sum(int(np.prod(s["shape"])) * 4 for s in json.load(open(os.path.join(path, "jaxport.json")))["params"])
  jax.block_until_ready(jax.jit(lambda a: a + 1)(np.ones(4)))   # the backend up before measuring
  reset_peak()
  start = vm("VmRSS")
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0]) if placement == "device" else None
  fn, params = jaxport.load(path, sharding=sharding)
  load_peak = vm("VmHWM") - start
  x = np.ones((2, 1024), np.float32)
  reset_peak()
  start_call = vm("VmRSS")
  jax.block_until_ready(fn.outputs_only(params, x))
  return {"weights": weights, "load_peak": load_peak, "call_peak": vm("VmHWM") - start_call}


class _Counting:
  """safe_open with a count of the tensor bytes read (every read goes through a slice)."""
  read = 0

  def __init__(self, path, framework):
    self._f = _REAL(path, framework=framework)

  def __enter__(self):
    self._f.__enter__()
    return self

  def __exit__(self, *exc):
    return self._f.__exit__(*exc)

  def keys(self):
    return self._f.keys()

  def get_slice(self, name):
    return _CountingSlice(self._f.get_slice(name))


class _CountingSlice:
  def __init__(self, tensor):
    self._t = tensor

  def get_shape(self):
    return self._t.get_shape()

  def get_dtype(self):
    return self._t.get_dtype()

  def __getitem__(self, index):
    value = self._t[index]
    _Counting.read += np.asarray(value).nbytes
    return value


_REAL = _params.safe_open


def distributed(path: str, port: str, process_id: str) -> dict:
  """One of two processes (2 CPU devices each): loads fsdp over the 4 devices, counting the bytes read."""
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=int(process_id))
  _params.safe_open = _Counting
  fn, params = jaxport.load(path, sharding="fsdp", verify=False)
  read = _Counting.read
  _params.safe_open = _REAL
  # what the shards of its own devices hold, a slice two local devices share (replicated) read once
  expected = sum(np.asarray(s.data).nbytes for k, v in params.items()
                 for s in {str(s.index): s for s in v.addressable_shards}.values())
  full = {}
  from safetensors import safe_open
  for name in json.load(open(os.path.join(path, "jaxport.json")))["files"]:
    if name.endswith(".safetensors"):
      with safe_open(os.path.join(path, name), framework="numpy") as f:
        full.update({k: f.get_tensor(k) for k in f.keys()})
  facts = shard_facts(params, full)
  data = np.load(os.path.join(path, "..", "inputs.npz"))
  replicated = jax.sharding.NamedSharding(next(iter(params.values())).sharding.mesh, jax.sharding.PartitionSpec())
  try:
    out = jax.jit(fn.outputs_only, out_shardings=replicated)(params, data["x"])
    out_close = bool(np.allclose(np.asarray(out.addressable_data(0)), data["y"], atol=1e-5, rtol=1e-5))
  except Exception as e:  # pylint: disable=broad-except  # reported, the test decides
    out_close = f"{type(e).__name__}: {e}"[:300]
  weights = sum(v.nbytes for v in full.values())
  return {"process": jax.process_index(), "global_devices": jax.device_count(),
          "local_devices": jax.local_device_count(),
          "read": read, "expected_read": expected, "weights": weights, "shards": facts, "out_close": out_close}


def convert8(path: str, inputs: str) -> dict:   # path: the directory of model.keras
  """With TF: a Keras model converted, its params placed fsdp by shard_params, run on 8 devices."""
  import tensorflow as tf

  from jaxport.sharding import shard_params
  data = np.load(inputs)
  model = tf.keras.models.load_model(os.path.join(path, "model.keras"))
  jax_fn, params = jaxport.convert(model, tf.TensorSpec((None, data["x"].shape[1]), tf.float32))
  sharded = shard_params(params, "fsdp")
  out = jax.jit(jax_fn.outputs_only)(sharded, data["x"])
  return {"out_close": bool(np.allclose(np.asarray(out), data["y"], atol=1e-5, rtol=1e-5)),
          "fsdp": shard_facts(sharded, {k: np.asarray(v) for k, v in params.items()})}


if __name__ == "__main__":
  mode, *args = sys.argv[1:]
  modes = {"load8": load8, "memory": memory, "export_memory": export_memory, "distributed": distributed,
           "convert8": convert8}
  result = modes[mode](*args)
  print("RESULT " + json.dumps(result))
