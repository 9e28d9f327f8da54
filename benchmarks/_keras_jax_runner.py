"""Times a benchmark model on Keras 3's JAX backend, in its own process (run by convert_bench.py).

  KERAS_BACKEND=jax python _keras_jax_runner.py MODEL WEIGHTS.weights.h5

Builds MODEL as `_bench_models.build_model` does, loads the parent's weights, then serves commands
from stdin, one per line, answering one JSON line prefixed `@@ ` on stdout:
  prepare INPUT.npy -> jit-compiles `stateless_call` for that input, runs it once, saves the output
                       to INPUT.npy.out.npy; answers {"compile_s": ...}
  time              -> one steady-state call; answers {"s": ...}
  quit
The parent interleaves `time` with its own timings, so both see the same machine load.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main() -> None:
  import jax
  import numpy as np

  from _bench_models import build_model

  name, weights = sys.argv[1], sys.argv[2]
  model = build_model(name)
  model.load_weights(weights)
  trainable = [v.value for v in model.trainable_variables]
  non_trainable = [v.value for v in model.non_trainable_variables]

  # What Keras's own predict step runs: a stateless call with the variables as arguments.
  @jax.jit
  def predict(trainable, non_trainable, x):
    return model.stateless_call(trainable, non_trainable, x, training=False)[0]

  compiled = x = None
  reply({"ready": True})
  for line in sys.stdin:
    command, *rest = line.split()
    if command == "prepare":
      x = jax.device_put(np.load(rest[0]))
      start = time.perf_counter()
      compiled = predict.lower(trainable, non_trainable, x).compile()
      compile_s = time.perf_counter() - start
      np.save(rest[0] + ".out.npy", np.asarray(jax.block_until_ready(compiled(trainable, non_trainable, x))))
      reply({"compile_s": compile_s})
    elif command == "time":
      start = time.perf_counter()
      jax.block_until_ready(compiled(trainable, non_trainable, x))
      reply({"s": time.perf_counter() - start})
    elif command == "quit":
      return


def reply(message: dict) -> None:
  print("@@ " + json.dumps(message), flush=True)


if __name__ == "__main__":
  main()
