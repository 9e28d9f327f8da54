"""One of the two processes of test_data_multiprocess.py.

Usage: python data_mp_worker.py PROCESS_ID PORT EXAMPLES GLOBAL_BATCH
Prints one JSON line: for each last_batch policy and epoch, the example ids this process received
(padding excluded), its number of steps, and the global count of real examples per epoch.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")


def local_rows(array) -> dict:
  import numpy as np  # pylint: disable=import-outside-toplevel
  return {shard.device: np.asarray(shard.data) for shard in array.addressable_shards}


def main(process_id: int, port: int, examples: int, global_batch: int) -> None:
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                             process_id=process_id, initialization_timeout=60)
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel

  import jaxport.data  # pylint: disable=import-outside-toplevel

  assert jax.process_count() == 2 and len(jax.devices()) == 4 and len(jax.local_devices()) == 2
  sharding = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))
  dataset = tf.data.Dataset.range(examples).map(
      lambda i: {"id": tf.cast(i, tf.int32), "x": tf.fill([3], tf.cast(i, tf.float32))})
  count = jax.jit(lambda mask: mask.sum())  # a reduction across both processes' devices
  report = {}
  for policy in ("pad", "drop"):
    loader = jaxport.data.loader(dataset, batch_size=global_batch, sharding=sharding,
                                 last_batch=policy)
    epochs = []
    for _ in range(2):
      seen, steps, total = [], 0, 0
      for batch in loader:
        steps += 1
        assert batch["id"].shape == (global_batch,) and batch["x"].shape == (global_batch, 3)
        assert batch["id"].sharding == sharding and not batch["id"].is_fully_addressable
        ids, features = local_rows(batch["id"]), local_rows(batch["x"])
        masks = local_rows(batch["mask"]) if policy == "pad" else None
        for device, rows in ids.items():
          np.testing.assert_array_equal(features[device][:, 0], rows)
          seen += (rows[masks[device]] if masks else rows).tolist()
        if policy == "pad":
          total += int(count(batch["mask"]))
      epochs.append({"ids": seen, "steps": steps, "global_examples": total})
    report[policy] = {"len": len(loader), "epochs": epochs}
    loader.close()
  print(json.dumps(report), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main(*map(int, sys.argv[1:]))
