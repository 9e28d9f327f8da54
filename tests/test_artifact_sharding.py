"""Big models: params files split with an index, sharded loads, FSDP defaults, memory.

Exports write the params tensor by tensor (one file, or shard files and an index); `jaxport.load(...,
sharding=...)` reads each param from the memory-mapped files into its shards. The 8-device cases run in
subprocesses with `--xla_force_host_platform_device_count=8` and TensorFlow blocked; two processes under
`jax.distributed` each read only their own shards; peak memory is measured in subprocesses (VmHWM).
"""
from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jaxport
from jaxport import artifact, sharding
from jaxport.errors import ArtifactError, UnsupportedValueError

WORKER = pathlib.Path(__file__).with_name("sharding_worker.py")
SRC = pathlib.Path(jaxport.__file__).resolve().parents[1]


def _run_worker(*args, devices: int = 1, timeout: int = 180, **popen) -> dict:
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, str(WORKER), *map(str, args)], env=env, capture_output=True, text=True,
                        timeout=timeout, **popen)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return _result(proc.stdout)


def _result(stdout: str) -> dict:
  line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
  return json.loads(line[len("RESULT "):])


def _mlp(x_dim=64):
  """A few-MB function of plain JAX and its params: kernels big enough for fsdp to split."""
  rng = np.random.RandomState(0)
  params = {"dense/kernel": rng.normal(size=(x_dim, 512)).astype(np.float32) / 8,
            "dense/bias": rng.normal(size=(512,)).astype(np.float32),
            "dense_1/kernel": rng.normal(size=(512, 512)).astype(np.float32) / 22,
            "dense_1/bias": np.zeros(512, np.float32),
            "dense_2/kernel": rng.normal(size=(512, 256)).astype(np.float32) / 22,
            "scale": np.array(1.5, np.float32)}

  def fn(p, x, rng=None):
    h = jnp.tanh(x @ p["dense/kernel"] + p["dense/bias"])
    h = jnp.tanh(h @ p["dense_1/kernel"] + p["dense_1/bias"])
    return h @ p["dense_2/kernel"] * p["scale"], p
  return fn, params


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """An MLP exported split over several params files, with its inputs and outputs saved beside."""
  root = tmp_path_factory.mktemp("sharded")
  fn, params = _mlp()
  x = np.random.RandomState(1).normal(size=(4, 64)).astype(np.float32)
  path = root / "artifact"
  manifest = jaxport.export(fn, params, x, path=path, platforms=("cpu",), max_shard_bytes=600_000)
  np.savez(root / "inputs.npz", x=x, y=np.asarray(fn(params, x)[0]))
  return path, fn, params, x, manifest


def test_params_split_over_files_with_an_index(exported):
  path, fn, params, x, manifest = exported
  shards = [artifact.shard_file(i, 3) for i in (1, 2, 3)]
  assert set(manifest["files"]) == {artifact.FUNCTION_FILE, artifact.PARAMS_INDEX, *shards}
  assert sorted(os.listdir(path)) == sorted([artifact.MANIFEST, *manifest["files"]])
  index = json.loads((path / artifact.PARAMS_INDEX).read_text())
  assert set(index["weight_map"]) == set(params) and set(index["weight_map"].values()) == set(shards)
  assert index["metadata"]["total_size"] == sum(v.nbytes for v in params.values())
  loaded_fn, loaded = jaxport.load(path)
  assert list(loaded) == list(params)
  for k in params:
    np.testing.assert_array_equal(loaded[k], params[k])
    assert isinstance(loaded[k], jaxport.Variable) and loaded[k].name == k
  np.testing.assert_allclose(loaded_fn.outputs_only(loaded, x), fn(params, x)[0], rtol=1e-5, atol=1e-5)


def test_reexport_to_one_file_removes_the_shard_files(exported, tmp_path):
  _, fn, params, x, _ = exported
  path = tmp_path / "a"
  jaxport.export(fn, params, x, path=path, platforms=("cpu",), max_shard_bytes=600_000)
  manifest = jaxport.export(fn, params, x, path=path, platforms=("cpu",))
  assert set(manifest["files"]) == {artifact.FUNCTION_FILE, artifact.PARAMS_FILE}
  assert sorted(os.listdir(path)) == sorted([artifact.MANIFEST, artifact.FUNCTION_FILE, artifact.PARAMS_FILE])
  _, loaded = jaxport.load(path, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))
  assert all(isinstance(v, jax.Array) and np.array_equal(v, params[k]) for k, v in loaded.items())


def _copy(src, dst):
  dst.mkdir()
  for name in os.listdir(src):
    (dst / name).write_bytes((src / name).read_bytes())
  return dst


def test_damaged_shard_or_index_raises(exported, tmp_path):
  path = exported[0]
  bad = _copy(path, tmp_path / "bad_shard")
  shard = bad / artifact.shard_file(2, 3)
  shard.write_bytes(shard.read_bytes()[:-4] + b"\0\0\0\0")
  with pytest.raises(ArtifactError, match="params-00002-of-00003.safetensors: its SHA-256"):
    jaxport.load(bad, sharding="fsdp")
  missing = _copy(path, tmp_path / "missing")
  (missing / artifact.shard_file(3, 3)).unlink()
  with pytest.raises(ArtifactError, match="params-00003-of-00003.safetensors is missing"):
    jaxport.load(missing)
  index = _copy(path, tmp_path / "index")
  (index / artifact.PARAMS_INDEX).write_text("{}")
  with pytest.raises(ArtifactError, match="index.json: its SHA-256"):
    jaxport.load(index)
  manifest = json.loads((path / artifact.MANIFEST).read_text())
  del manifest["files"][artifact.shard_file(2, 3)]
  listed = _copy(path, tmp_path / "listed")
  (listed / artifact.MANIFEST).write_text(json.dumps(manifest))
  with pytest.raises(ArtifactError, match="field files lists"):
    jaxport.load(listed)


def test_fsdp_spec_splits_the_largest_divisible_dim():
  assert sharding.fsdp_spec((512, 1024), 8, "fsdp") == P(None, "fsdp")
  assert sharding.fsdp_spec((1024, 512), 8, "fsdp") == P("fsdp", None)
  assert sharding.fsdp_spec((1004, 512), 8, "fsdp") == P(None, "fsdp")   # 1004 is not divisible by 8
  assert sharding.fsdp_spec((1001, 999), 8, "fsdp") == P()               # no dim divides
  assert sharding.fsdp_spec((512,), 8, "fsdp") == P()                    # small: replicated
  assert sharding.fsdp_spec((), 8, "fsdp") == P()
  assert sharding.fsdp_spec((512, 512), 8, "fsdp", min_size=1) == P("fsdp", None)
  assert sharding.fsdp_spec((512, 1024), 1, "fsdp") == P()
  mesh = Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
  specs = sharding.fsdp_shardings({"w": jax.ShapeDtypeStruct((256, 512), np.float32)}, mesh)
  assert specs["w"].mesh is mesh and specs["w"].spec == P()   # one device: nothing to split


def test_sharding_forms_and_their_errors(exported):
  path, _, params, _, _ = exported
  mesh = Mesh(np.asarray(jax.devices()[:1]), ("fsdp",))
  # the artifact's directory, its loaded function and a params dict give the same specs
  fn, _ = jaxport.load(path)
  assert sharding.param_specs(path) == sharding.param_specs(fn) == sharding.param_specs(params)
  by_callable = sharding.resolve(lambda name, shape, dtype: P(), path, mesh)
  assert set(by_callable) == set(params) and all(s.spec == P() for s in by_callable.values())
  by_rules = sharding.resolve([("kernel$", P(None, "fsdp"))], path, mesh)
  assert by_rules["dense_1/kernel"].spec == P(None, "fsdp") and by_rules["dense/bias"].spec == P()
  with pytest.raises(UnsupportedValueError, match="names no sharding for 5"):
    jaxport.load(path, sharding={"scale": NamedSharding(mesh, P())})
  with pytest.raises(UnsupportedValueError, match="'fsdp' and 'replicated'"):
    jaxport.load(path, sharding="zero3")
  with pytest.raises(UnsupportedValueError, match="cannot split its shape"):
    sharding.resolve({k: P("fsdp", "x") for k in params}, params, mesh)
  with pytest.raises(UnsupportedValueError, match="is a int"):
    sharding.resolve(lambda *a: 3, params, mesh)


def test_load_sharded_on_8_devices_without_tf(exported):
  """8 devices: fsdp places every big kernel split over all 8, each device holding its slice only;
  the jitted run matches the single-device one; rules and a dict by name place params as asked."""
  path = exported[0]
  r = _run_worker("load8", path, path.parent / "inputs.npz", devices=8)
  assert r["devices"] == 8 and r["tf_blocked"] and r["out_close"]
  assert r["out_devices"] == 8   # the output stays spread over the devices, nothing gathered onto one
  assert r["reexport_same"]      # sharded params exported again: byte-identical params files
  fsdp = r["fsdp"]
  assert fsdp["dense_1/kernel"]["spec"] == ["fsdp", None]
  assert fsdp["dense_1/kernel"]["shard_shapes"] == [[64, 512]] and fsdp["dense_1/kernel"]["devices"] == list(range(8))
  assert fsdp["dense_2/kernel"]["shard_shapes"] == [[64, 256]]
  assert fsdp["dense/bias"]["spec"] == [] and fsdp["dense/bias"]["shard_shapes"] == [[512]]
  assert all(f["shards_match"] for form in ("fsdp", "rules", "replicated") for f in r[form].values())
  assert r["rules"]["dense/kernel"]["shard_shapes"] == [[64, 64]]   # (None, fsdp): 512 / 8 columns
  assert r["rules"]["dense/bias"]["spec"] == []
  assert r["replicated"]["dense_1/kernel"]["shard_shapes"] == [[512, 512]]
  assert r["load_peak"] < 1.1 * r["weights"] + (48 << 20)   # each device its share: the weights once, in all


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_each_read_their_own_shards(exported):
  """jax.distributed on localhost, 2 processes of 2 CPU devices: fsdp over the 4 devices; each process
  reads from the files the bytes of its own devices' shards only."""
  path = exported[0]
  port = _free_port()
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]), JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, str(WORKER), "distributed", str(path), str(port), str(i)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    outs = [p.communicate(timeout=180) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  results = [_result(out) for out, _ in outs]
  assert sorted(r["process"] for r in results) == [0, 1]
  for r in results:
    assert r["global_devices"] == 4 and r["local_devices"] == 2
    assert r["read"] == r["expected_read"]   # only the slices of its own devices
    kernel = r["shards"]["dense_1/kernel"]
    assert kernel["shard_shapes"] == [[128, 512]] and kernel["shards_match"]
    assert all(f["shards_match"] for f in r["shards"].values())
    # the three big kernels are split in 4, so a process reads about half of them
    assert r["read"] < 0.7 * r["weights"], r
    assert r["out_close"] is True, r["out_close"]
  devices = [set(r["shards"]["dense_1/kernel"]["devices"]) for r in results]
  assert devices[0].isdisjoint(devices[1])


@pytest.mark.slow
def test_converted_keras_params_fsdp_on_8_devices(tmp_path):
  """A Keras model's converted params placed by `shard_params(params, "fsdp")` run on 8 devices."""
  tf = pytest.importorskip("tensorflow")
  model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(512, activation="tanh"),
                               tf.keras.layers.Dense(256)])
  model.save(tmp_path / "model.keras")
  x = np.random.RandomState(2).normal(size=(4, 64)).astype(np.float32)
  np.savez(tmp_path / "inputs.npz", x=x, y=model(x).numpy())
  r = _run_worker("convert8", tmp_path, tmp_path / "inputs.npz", devices=8)
  assert r["out_close"]
  kernel = next(f for f in r["fsdp"].values() if f["shape"] == [512, 256])
  assert kernel["spec"] == ["fsdp", None] and kernel["shard_shapes"] == [[64, 256]] and kernel["shards_match"]


def test_memory_export_streams_and_load_holds_one_copy(tmp_path):
  """256 MiB of params (16 MiB each): export adds well under one copy (no serialized blob); load holds the
  weights once (no bytes copy), as NumPy or on the device, and a first call hands them to JAX as they are."""
  path = tmp_path / "big"
  e = _run_worker("export_memory", path)
  assert e["export_peak"] < 0.3 * e["weights"], e
  assert len([n for n in os.listdir(path) if n.endswith(".safetensors")]) == 3   # 6 params of 16 MiB a file
  # on a device, JAX's copy of a slice lands while the host slice is alive: about one param more
  for placement, bound in (("numpy", 1.1), ("device", 1.2)):
    m = _run_worker("memory", path, placement)
    assert m["load_peak"] < bound * m["weights"], (placement, m)
    assert m["call_peak"] < 0.3 * m["weights"], (placement, m)


def test_converted_params_share_tf_memory_and_keep_their_values():
  """convert hands a CPU variable's buffer to JAX without a copy; TF writing the variable afterwards
  (assign, an optimizer step) writes a new buffer, so the params keep the values they were read with."""
  tf = pytest.importorskip("tensorflow")
  v = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3))
  jax_fn, params = jaxport.convert(tf.function(lambda x: x @ v), tf.TensorSpec((1, 2), tf.float32))
  (key,) = params
  before = np.array(params[key])
  assert not params[key].flags.writeable   # a view of the shared buffer, not a copy of it
  run = jax.jit(jax_fn.outputs_only)
  x = np.ones((1, 2), np.float32)
  np.testing.assert_allclose(run(params, x), x @ before)
  v.assign_add(tf.ones((2, 3)))
  tf.keras.optimizers.SGD(1.0).apply_gradients([(tf.ones((2, 3)), v)])
  np.testing.assert_array_equal(params[key], before)
  np.testing.assert_allclose(run(params, x), x @ before)
  np.testing.assert_array_equal(v.numpy(), before)   # +1 then -1
