"""The library corpora (TFP, Sonnet 2, TFRS, TF-Agents) as a table: per program, the checks it passes
and its times: conversion, the converted call without jit (first call: the graph compiled as one jit, or
op by op for a small graph, each op compiled on first use; then the best of 2 later calls), TF's eager
call (op by op, best of 2) and `tf.function` call (best of 3, after tracing), and the jitted converted
call (best of 3, after compiling).

  python benchmarks/corpus_libraries_bench.py [--only tfp,sonnet] [--markdown]

Runs the same programs and checks as tests/convert/test_corpus_*.py (their `CORPUS`); a program that
fails its checks is listed with the error instead of times.
"""
import argparse
import importlib
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "convert")]
from _timing import best_of  # noqa: E402 - benchmarks/ is on the path when run as a script

MODULES = {"tfp": "test_corpus_tfp", "sonnet": "test_corpus_sonnet", "tfrs": "test_corpus_tfrs",
           "tf_agents": "test_corpus_tf_agents"}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", default=",".join(MODULES))
  parser.add_argument("--markdown", action="store_true")
  opts = parser.parse_args()
  import library_corpus
  import tensorflow as tf
  rows, failures = [], []
  for key in opts.only.split(","):
    module = importlib.import_module(MODULES[key])
    keras2 = key in ("tfrs", "tf_agents")
    for name, program in module.CORPUS.items():
      xfail = getattr(module, "XFAIL", {}).get(name)
      try:
        with (library_corpus.legacy_tf_keras() if keras2 else _nothing()):
          fn, args, options = program()
          jax_fn, params = library_corpus.check_program(name, module.__name__, fn, *args, **options)
          t = dict(library_corpus.TIMINGS[name])
          t["eager2_s"] = best_of(jax_fn, params, *args, n=2)
          t["tf_eager_s"] = best_of(fn, *[tf.constant(a) for a in args], n=2)
        rows.append((name, t))
      except Exception as e:   # noqa: BLE001 - the table lists it
        failures.append((name, "xfail" if xfail else "FAIL", f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"))
        if not xfail:
          traceback.print_exc()
  header = ["program", "library", "checks", "convert s", "eager 1st s", "eager ms", "TF eager ms", "TF graph ms",
            "jit ms", "eager/TF eager"]
  table = [[name, t["library"].replace("test_corpus_", ""), t["checks"], f"{t['convert_s']:.2f}",
            f"{t['eager_s']:.2f}", f"{1e3 * t['eager2_s']:.2f}", f"{1e3 * t['tf_eager_s']:.2f}",
            f"{1e3 * t['tf_s']:.2f}", f"{1e3 * t['jit_s']:.3f}", f"{t['eager2_s'] / t['tf_eager_s']:.1f}x"]
           for name, t in rows]
  _print(header, table, opts.markdown)
  for name, kind, why in failures:
    print(f"{kind}: {name}: {why}")


class _nothing:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def _print(header, table, markdown):
  if markdown:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in table:
      print("| " + " | ".join(row) + " |")
    return
  widths = [max(len(str(r[i])) for r in [header, *table]) for i in range(len(header))]
  for row in [header, *table]:
    print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
  main()
