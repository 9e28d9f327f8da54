"""A process of test_data_random_access.py's elastic restore: 2 processes save, 1 restores.

Usage: python data_elastic_worker.py PROCESSES PROCESS_ID PORT STATE_PATH
With 2 processes: reads epoch 0 and the first STOP steps of epoch 1 of each source, and process 1
writes its states to STATE_PATH. With 1 process: restores those states and finishes epoch 1.
Prints one JSON line: per source, the example ids this process received (padding excluded) and
the indices it read from the source.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import jax  # noqa: E402

jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_cpu_collectives_implementation", "gloo")

EXAMPLES, GLOBAL_BATCH, STOP = 13, 4, 2


class Counted:
  def __init__(self, n):
    self.n, self.reads = n, []

  def __len__(self):
    return self.n

  def __getitem__(self, i):
    self.reads.append(int(i))
    return {"id": i, "x": [float(i)] * 3}


def main(processes: int, process_id: int, port: int, state_path: str) -> None:
  if processes > 1:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=processes,
                               process_id=process_id, initialization_timeout=60)
  import grain  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import (  # pylint: disable=import-outside-toplevel
      Mesh, NamedSharding, PartitionSpec)

  import jaxport.data  # pylint: disable=import-outside-toplevel

  sharding = NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))
  sources = {
      "random_access": lambda counted: jaxport.data.RandomAccess(counted, seed=11),
      "grain": lambda counted: grain.MapDataset.source(counted).shuffle(seed=3).map(
          lambda e: {"id": np.int64(e["id"]), "x": np.asarray(e["x"], np.float32)}),
  }
  saved = json.loads(open(state_path).read()) if processes == 1 else {}
  report, states = {}, {}
  for name, make in sources.items():
    counted = Counted(EXAMPLES)
    loader = jaxport.data.loader(make(counted), batch_size=GLOBAL_BATCH, sharding=sharding,
                                 last_batch="pad", state=saved.get(name))

    def local_ids(batch):
      rows = {s.device: np.asarray(s.data) for s in batch["id"].addressable_shards}
      masks = {s.device: np.asarray(s.data) for s in batch["mask"].addressable_shards}
      return [int(i) for device in rows for i in rows[device][masks[device]]]

    out = {"n": EXAMPLES}
    if processes > 1:
      out["epoch0"] = [i for batch in loader for i in local_ids(batch)]
      out["epoch1"] = []
      for _ in range(STOP):
        out["epoch1"] += local_ids(next(iter(loader)))
      states[name] = loader.state()
    else:
      out["epoch1"] = [i for batch in loader for i in local_ids(batch)]
      out["reads"] = counted.reads
    loader.close()
    report[name] = out
  if processes > 1 and process_id == 1:
    with open(state_path, "w") as file:
      file.write(json.dumps(states))
  print(json.dumps(report), flush=True)
  if processes > 1:
    jax.distributed.shutdown()


if __name__ == "__main__":
  main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
