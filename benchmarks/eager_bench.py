"""Eager calls (no jit) of programs whose shapes depend on values, so they cannot run as one jit:
jaxport in segments (each run of traceable nodes one jit, the value-dependent nodes op by op; the
default), jaxport op by op (`eager_jit` off), TF eager (the Python function, op by op) and TF's graph
(`tf.function`). Medians of interleaved calls, ms, after warm-up; "16 batches" cycles through 16
inputs whose sparse sizes differ, as a training loop's batches do (each size compiles once).

  python benchmarks/eager_bench.py [--repeats 15] [--plot eager_bench.png]
"""
import argparse
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from _timing import interleaved, timed  # noqa: E402 - benchmarks/ is on the path when run as a script


def programs(rs):
  """name -> (tf.function, a maker of its inputs from a seed)."""
  import numpy as np
  import tensorflow as tf
  import tf_keras
  fc = tf.feature_column
  ids_a, ids_b = fc.categorical_column_with_identity("a", 1000), fc.categorical_column_with_identity("b", 50)
  layer = tf_keras.layers.DenseFeatures([
      fc.embedding_column(ids_a, 16), fc.indicator_column(ids_b),
      fc.embedding_column(fc.crossed_column([ids_a, ids_b], 5000), 8), fc.numeric_column("c")])

  def features(seed):
    r = np.random.RandomState(seed)
    return ({"a": r.randint(0, 1000, (64, 3)).astype(np.int64), "b": r.randint(-1, 50, (64, 2)).astype(np.int64),
             "c": r.normal(size=(64, 1)).astype(np.float32)},)
  layer(*features(0))
  table = tf.Variable(rs.normal(size=(1000, 16)).astype(np.float32))

  def lookup(ids):
    return tf.nn.safe_embedding_lookup_sparse(table, tf.sparse.from_dense(ids), None, combiner="mean")

  def ids(seed):
    r = np.random.RandomState(seed)
    return (r.randint(0, 1000, (64, 4)).astype(np.int64) * (r.rand(64, 4) > 0.3),)

  def ctc(labels, probs):
    return tf_keras.backend.ctc_batch_cost(labels, probs, tf.fill([8, 1], 50), tf.fill([8, 1], 10))

  def ctc_inputs(seed):
    r = np.random.RandomState(seed)
    labels = r.randint(1, 20, (8, 10)).astype(np.float32)
    labels[:, r.randint(5, 10):] = 0   # padded labels: the sparse label count varies
    return labels, tf.nn.softmax(r.normal(size=(8, 50, 21)).astype(np.float32)).numpy()

  return {"tf_keras DenseFeatures (embedding, indicator, crossed), batch 64": (tf.function(lambda f: layer(f)), features),
          "safe_embedding_lookup_sparse, 64x4 ids, 1000x16": (tf.function(lookup), ids),
          "tf_keras ctc_batch_cost, batch 8, 50 steps": (tf.function(ctc), ctc_inputs)}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=15)
  parser.add_argument("--plot", type=pathlib.Path, default=None)
  opts = parser.parse_args()
  import jax
  import numpy as np
  import jaxport
  rows = []
  for name, (fn, make) in programs(np.random.RandomState(0)).items():
    jax_fn, params = jaxport.convert(fn, *make(0))
    for label, inputs in (("1 batch", [make(0)]), ("16 batches", [make(s) for s in range(16)])):
      np.testing.assert_allclose(np.asarray(jax.tree.leaves(jax_fn(params, *inputs[-1])[0])[0]),
                                 np.asarray(fn(*inputs[-1])), rtol=1e-4, atol=1e-5)

      def cycling(call):
        state = {"i": 0}

        def run():
          state["i"] += 1
          return call(*inputs[state["i"] % len(inputs)])
        return timed(run)

      def op_by_op(*args):
        with jaxport.override_config("eager_jit", False):
          return jax_fn(params, *args)
      runners = {"segments": cycling(lambda *a: jax_fn(params, *a)), "op by op": cycling(op_by_op),
                 "TF eager": cycling(fn.python_function), "TF graph": cycling(fn)}
      for run in runners.values():   # each size compiled (traced) once, as after a training loop's first epoch
        for _ in range(2 * len(inputs)):
          run()
      med = interleaved(runners, opts.repeats)
      rows.append((name, label, {k: 1e3 * v for k, v in med.items()}))
  header = ["program", "inputs", "TF graph", "TF eager", "jaxport op by op", "jaxport segments", "segments/TF graph"]
  print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
  for name, label, t in rows:
    print(f"| {name} | {label} | {t['TF graph']:.2f} | {t['TF eager']:.2f} | {t['op by op']:.2f} | "
          f"**{t['segments']:.2f}** | {t['segments'] / t['TF graph']:.1f}x |")
  if opts.plot:
    plot(rows, opts.plot)


def plot(rows, path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np
  systems = ["TF graph", "TF eager", "op by op", "segments"]
  fig, ax = plt.subplots(figsize=(10, 4))
  x = np.arange(len(rows))
  for k, system in enumerate(systems):
    ax.bar(x + (k - 1.5) * 0.2, [t[system] for _, _, t in rows], 0.2, label=system)
  ax.set_xticks(x, [f"{name.split(',')[0]}\n{label}" for name, label, _ in rows], fontsize=7)
  ax.set_ylabel("ms per eager call")
  ax.set_yscale("log")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path)
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
