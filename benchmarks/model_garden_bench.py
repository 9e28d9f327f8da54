"""The TF Model Garden corpus as a table: per program, the checks it passes and its times: conversion,
the converted call without jit (first call: the graph compiled as one jit, config `eager_jit`, or op
by op where it cannot trace, each op compiled on first use; second call: what eager use costs), TF's eager call (Keras, op by op) and `tf.function` call, and the jitted converted call.

  python benchmarks/model_garden_bench.py [--only bert_encoder,retinanet] [--markdown]

Runs the programs and checks of tests/convert/test_corpus_model_garden.py; a program that fails its
checks is listed with the error instead of times.
"""
import argparse
import os
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "convert")]
from _timing import best_of  # noqa: E402 - benchmarks/ is on the path when run as a script


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", default="")
  parser.add_argument("--markdown", action="store_true")
  opts = parser.parse_args()
  import library_corpus
  import test_corpus_model_garden as corpus
  rows, failures = [], []
  for name, (program, training) in corpus._cases():
    if opts.only and name not in opts.only.split(","):
      continue
    try:
      fn, args, options = program()
      fn = options.pop("train_fn") if training else fn
      jax_fn, params = corpus.check_model_garden(name, program, training) or (None, None)
      if jax_fn is None:   # eager-only programs: convert here for the times
        import jaxport
        import tensorflow as tf
        start = time.perf_counter()
        jax_fn, params = jaxport.convert(tf.function(fn), *args)
        convert_s = time.perf_counter() - start
        library_corpus.TIMINGS[name] = dict(
            library="Model Garden", checks="values (eager only)", convert_s=convert_s,
            eager_s=best_of(jax_fn, params, *args, n=1), tf_s=best_of(tf.function(fn), *args), jit_s=float("nan"))
      t = dict(library_corpus.TIMINGS[name])
      t["eager2_s"] = best_of(jax_fn, params, *args, n=2)
      import tensorflow as tf
      t["tf_eager_s"] = best_of(fn, *[tf.constant(a) for a in args], n=2)
      rows.append((name, t))
    except Exception as e:   # noqa: BLE001 - the table lists it
      failures.append((name, "xfail" if name in corpus.XFAIL else "FAIL",
                       f"{type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"))
      if name not in corpus.XFAIL:
        traceback.print_exc()
  header = ["program", "checks", "convert s", "eager 1st s", "eager s", "TF eager s", "TF graph s", "jit s",
            "eager/TF eager"]
  table = [[name, t["checks"], f"{t['convert_s']:.2f}", f"{t['eager_s']:.2f}", f"{t['eager2_s']:.3f}",
            f"{t['tf_eager_s']:.3f}", f"{t['tf_s']:.4f}", f"{t['jit_s']:.4f}",
            f"{t['eager2_s'] / t['tf_eager_s']:.1f}x"]
           for name, t in rows]
  if opts.markdown:
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in table:
      print("| " + " | ".join(row) + " |")
  else:
    widths = [max(len(str(r[i])) for r in [header] + table) for i in range(len(header))]
    for row in [header] + table:
      print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
  for name, kind, why in failures:
    print(f"{kind}: {name}: {why}")


if __name__ == "__main__":
  main()
