"""Two processes on this machine (jax.distributed over loopback, CPU devices) read one tf.data
source through jaxport.data.loader with a global-batch sharding: every example is seen exactly
once per epoch across the processes, and both run the same number of steps."""
import pathlib
import socket

import pytest

from data_support import run_workers

WORKER = pathlib.Path(__file__).with_name("data_mp_worker.py")
TIMEOUT_S = 300


def free_port() -> int:
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]


@pytest.mark.parametrize("examples, global_batch", [(13, 4)])
def test_two_processes_see_every_example_once_per_epoch(examples, global_batch):
  port = free_port()
  outputs = run_workers(WORKER, [[str(i), str(port), str(examples), str(global_batch)]
                                 for i in range(2)], TIMEOUT_S)

  pad = [report["pad"] for report in outputs]
  steps = -(-examples // global_batch)
  for epoch in range(2):
    ids = pad[0]["epochs"][epoch]["ids"] + pad[1]["epochs"][epoch]["ids"]
    assert sorted(ids) == list(range(examples)), f"epoch {epoch}: {ids}"
    assert [p["epochs"][epoch]["steps"] for p in pad] == [steps, steps]
    assert [p["epochs"][epoch]["global_examples"] for p in pad] == [examples, examples]
  assert [p["len"] for p in pad] == [steps, steps]
  # Process 1 has one example fewer: its extra step is all padding.
  assert len(pad[0]["epochs"][0]["ids"]) == (examples + 1) // 2

  drop = [report["drop"] for report in outputs]
  steps = examples // global_batch
  for epoch in range(2):
    ids = drop[0]["epochs"][epoch]["ids"] + drop[1]["epochs"][epoch]["ids"]
    assert len(ids) == len(set(ids)) == steps * global_batch and set(ids) <= set(range(examples))
    assert [d["epochs"][epoch]["steps"] for d in drop] == [steps, steps]
