"""keras-hub text generation as a table: per task of the corpus (tests/convert/test_corpus_keras_hub.py,
`GENERATORS`), `generate_step` with the default `top_k` sampler converted by jaxport, against TF.

  python benchmarks/generate_bench.py [--only gpt2,t5] [--repeats 5]

Columns: conversion seconds; the converted call without jit (first call, then warm); `jax.jit` (first call
with its compile, then warm); TF's `tf.function` (first call with its trace, then warm) and TF eager
(Keras op by op, warm); and whether the tokens equal TF's. Warm times are interleaved medians.
Needs KERAS_BACKEND=tensorflow (set here).
"""
import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "convert")]
from _timing import block, interleaved, timed  # noqa: E402 - benchmarks/ is on the path when run as a script


def _first(fn):
  start = time.perf_counter()
  out = block(fn())
  return out, time.perf_counter() - start


def bench(name: str, repeats: int) -> dict:
  import jax
  import keras
  import numpy as np
  import tensorflow as tf

  import jaxport
  import test_corpus_keras_hub as corpus
  task, build = corpus.GENERATORS[name]
  keras.utils.set_random_seed(0)
  backbone = build()
  lm = task(backbone=backbone, preprocessor=None)
  lm.compile(sampler="top_k")
  inputs = corpus._fill(backbone)
  step = lambda x: lm.generate_step(x, stop_token_ids=None)  # noqa: E731
  graph = tf.function(step)
  start = time.perf_counter()
  jax_fn, params = jaxport.convert(graph, inputs)
  convert_s = time.perf_counter() - start
  expected, tf_first = _first(lambda: graph(inputs))   # the trace ran in convert: this is TF's first call
  eager_out, eager_first = _first(lambda: jax_fn(params, inputs))
  jitted = jax.jit(jax_fn)
  jit_out, jit_first = _first(lambda: jitted(params, inputs))
  same = all(np.array_equal(np.asarray(out[0][k]), np.asarray(expected[k])) for out in (eager_out, jit_out)
             for k in expected)
  warm = interleaved({"eager": timed(lambda: jax_fn(params, inputs)), "jit": timed(lambda: jitted(params, inputs)),
                      "tf": timed(lambda: graph(inputs)), "tf eager": timed(lambda: step(inputs))}, repeats)
  return dict(convert=convert_s, eager_first=eager_first, jit_first=jit_first, tf_first=tf_first, same=same,
              **warm)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", default="")
  parser.add_argument("--repeats", type=int, default=5)
  opts = parser.parse_args()
  import test_corpus_keras_hub as corpus
  names = [n for n in corpus.GENERATORS if not opts.only or n in opts.only.split(",")]
  print("| task | convert s | jaxport eager first / warm s | jax.jit first / warm s | TF graph first / warm s "
        "| TF eager warm s | tokens = TF's |")
  print("|---|---:|---:|---:|---:|---:|---|")
  for name in names:
    r = bench(name, opts.repeats)
    print(f"| {name} | {r['convert']:.2f} | {r['eager_first']:.2f} / {r['eager']:.3f} | {r['jit_first']:.2f} / "
          f"{r['jit']:.4f} | {r['tf_first']:.2f} / {r['tf']:.4f} | {r['tf eager']:.3f} | {r['same']} |", flush=True)


if __name__ == "__main__":
  main()
