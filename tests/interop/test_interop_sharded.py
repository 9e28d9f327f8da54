"""Multi-device jax.Arrays, on 4 virtual CPU devices in a subprocess (jax reads XLA_FLAGS once)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

CHECKS = textwrap.dedent('''
    import json, traceback
    import jax, jax.numpy as jnp, numpy as np, torch, tensorflow as tf
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxport import interop

    devices = jax.devices()
    assert len(devices) == 4, devices
    mesh = Mesh(np.array(devices), ("x",))
    split = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("x")))
    replicated = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P()))

    def split_into_shards():
      for convert, host in ((interop.to_torch, lambda t: t.numpy()), (interop.to_numpy, np.asarray),
                            (interop.to_tf, lambda t: t.numpy())):
        shards = convert(split)
        assert [s.index for s in shards] == [(slice(2 * i, 2 * i + 2),) for i in range(4)]
        assert [s.device for s in shards] == [f"cpu:{i}" for i in range(4)]
        for shard, part in zip(shards, split.addressable_shards):
          assert interop.shares_memory(shard.data, part.data)
          assert interop.shares_memory(shard.data, split) and interop.shares_memory(shard, split)
          np.testing.assert_array_equal(host(shard.data), np.arange(8.0)[shard.index])
      plans = interop.explain(split, "torch")
      assert len(plans) == 4 and all(s.data.zero_copy for s in plans)

    def single_raises_when_split():
      try:
        interop.to_torch(split, shards="single")
      except interop.ShardedArrayError as error:
        assert "4 devices" in str(error) and "shards='split'" in str(error)
      else:
        raise AssertionError("no error")

    def single_of_replicated_shares_one_copy():
      t = interop.to_torch(replicated, shards="single")
      assert isinstance(t, torch.Tensor) and t.tolist() == list(range(8))
      assert interop.shares_memory(t, replicated.addressable_shards[0].data)

    def jax_target_keeps_sharded_arrays():
      assert interop.to_jax(split) is split

    def import_onto_a_chosen_cpu_device_is_zero_copy():
      raw = np.empty(64 + 32, np.uint8)
      start = (-raw.ctypes.data) % 64
      host = raw[start:start + 32].view(np.float32)
      host[:] = np.arange(8)
      y = interop.to_jax(host, device=devices[3], copy=False)
      assert y.devices() == {devices[3]} and y.unsafe_buffer_pointer() == host.ctypes.data

    def moving_between_devices_copies_and_names_both():
      x = jax.device_put(jnp.arange(4.0), devices[1])
      y = interop.to_jax(x, device=devices[2])
      assert y.devices() == {devices[2]} and not interop.shares_memory(x, y)
      try:
        interop.to_jax(x, device=devices[2], copy=False)
      except BufferError as error:
        assert "cpu:1" in str(error) and "2" in str(error), error
      else:
        raise AssertionError("no error")

    def sharding_as_device_distributes_a_host_array():
      y = interop.to_jax(np.arange(8.0, dtype=np.float32), device=NamedSharding(mesh, P("x")))
      assert len(y.sharding.device_set) == 4
      np.testing.assert_array_equal(np.asarray(y), np.arange(8.0))
      plan = interop.explain(np.arange(8.0, dtype=np.float32), "jax",
                             device=NamedSharding(mesh, P("x")))
      assert not plan.zero_copy and plan.reasons[0].kind == "device"

    results = {}
    for check in (split_into_shards, single_raises_when_split, single_of_replicated_shares_one_copy,
                  jax_target_keeps_sharded_arrays, import_onto_a_chosen_cpu_device_is_zero_copy,
                  moving_between_devices_copies_and_names_both,
                  sharding_as_device_distributes_a_host_array):
      try:
        check()
        results[check.__name__] = "ok"
      except Exception:  # reported per check by the pytest side
        results[check.__name__] = traceback.format_exc()
    print("RESULTS" + json.dumps(results))
''')
NAMES = ["split_into_shards", "single_raises_when_split", "single_of_replicated_shares_one_copy",
         "jax_target_keeps_sharded_arrays", "import_onto_a_chosen_cpu_device_is_zero_copy",
         "moving_between_devices_copies_and_names_both",
         "sharding_as_device_distributes_a_host_array"]


@pytest.fixture(scope="module")
def results():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  done = subprocess.run([sys.executable, "-c", CHECKS], env=env, capture_output=True, text=True,
                        timeout=300, check=False)
  marker = [line for line in done.stdout.splitlines() if line.startswith("RESULTS")]
  assert marker, f"subprocess failed (rc={done.returncode}):\n{done.stderr[-4000:]}"
  return json.loads(marker[0][len("RESULTS"):])


@pytest.mark.parametrize("name", NAMES)
def test_sharded(results, name):
  assert results[name] == "ok", results[name]
