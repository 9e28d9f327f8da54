"""The processes of test_data_tf_service.py's two-process test.

  python data_service_worker.py servers WORKERS
      starts a tf.data service dispatcher and WORKERS workers on localhost, prints the
      dispatcher's target, and serves until its stdin closes.
  python data_service_worker.py consumer PROCESS_ID PORT TARGET
      one of two JAX processes (jax.distributed on localhost) reading service jobs through
      jaxport.data.loader; prints one JSON line: per scenario, the example ids it received
      (padding excluded), its steps, and the global count of real examples.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

EXAMPLES, GLOBAL_BATCH = 100, 8


def servers(workers: int) -> None:
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  service = tf.data.experimental.service
  dispatcher = service.DispatchServer(service.DispatcherConfig(
      port=0, work_dir=None, fault_tolerant_mode=False))
  address = dispatcher.target.split("://")[1]
  kept = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address))
          for _ in range(workers)]
  print(dispatcher.target, flush=True)
  sys.stdin.read()  # serve until the parent closes the pipe (or kills this process)
  del kept


def consumer(process_id: int, port: int, target: str) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                             process_id=process_id, initialization_timeout=60)
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=import-outside-toplevel

  import jaxport.data  # pylint: disable=import-outside-toplevel

  sharding = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))
  count = jax.jit(lambda mask: mask.sum())  # a collective over both processes' devices

  def dataset(mode: str, job_name: str | None):
    return tf.data.Dataset.range(EXAMPLES).map(
        lambda i: {"id": tf.cast(i, tf.int32), "x": tf.fill([3], tf.cast(i, tf.float32))}).apply(
            tf.data.experimental.service.distribute(mode, target, job_name=job_name))

  def epoch(loader, check_mid_epoch_state: bool = False) -> dict:
    seen, steps, total, refused = [], 0, 0, None
    for batch in loader:
      steps += 1
      assert batch["id"].shape == (GLOBAL_BATCH,) and not batch["id"].is_fully_addressable
      for shard, mask in zip(batch["id"].addressable_shards, batch["mask"].addressable_shards):
        seen += np.asarray(shard.data)[np.asarray(mask.data)].tolist()
      total += int(count(batch["mask"]))
      if check_mid_epoch_state and refused is None:
        try:
          loader.state()
        except jaxport.data.NotResumableError as error:
          refused = str(error)
    return {"ids": seen, "steps": steps, "global_examples": total, "refused": refused}

  def load(mode: str, job_name: str | None, **kwargs):
    return jaxport.data.loader(dataset(mode, job_name), batch_size=GLOBAL_BATCH,
                               sharding=sharding, last_batch="pad", **kwargs)

  report = {"errors": {}}
  for name, make in {"drop": lambda: jaxport.data.loader(dataset("distributed_epoch", "e1"),
                                                        batch_size=GLOBAL_BATCH),
                     "unnamed": lambda: load("distributed_epoch", None)}.items():
    try:
      make()
    except ValueError as error:
      report["errors"][name] = str(error)

  loader = load("distributed_epoch", "de")
  report["distributed"] = [epoch(loader, check_mid_epoch_state=True), epoch(loader)]
  saved = loader.state()  # at the epoch boundary: epoch 2, step 0
  loader.close()
  # The documented way to resume: the same pipeline with a job_name never used before.
  resumed = load("distributed_epoch", "de-resume1", state=saved)
  report["resumed"] = {"epoch": resumed.epoch, **epoch(resumed)}
  resumed.close()
  for name, job_name in (("parallel_shared", "pe"), ("parallel_own", None)):
    loader = load("parallel_epochs", job_name)
    report[name] = epoch(loader)
    loader.close()
  print(json.dumps(report), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  if sys.argv[1] == "servers":
    servers(int(sys.argv[2]))
  else:
    consumer(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
