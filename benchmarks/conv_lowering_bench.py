"""Dense conv lowerings on CPU: TF graph (oneDNN) vs XLA's conv vs GEMM-based lowerings.

For each conv shape prints, as wall time and as process CPU time (all threads; steadier than
wall time on a shared machine, but it counts idle spinning of thread pools): TF `tf.function(tf.nn.conv2d)` ms, `lax.conv_general_dilated` ms,
each candidate of `jaxport.convert.ops.conv_lowering` ms (all under jit, NHWC, SAME padding),
the max relative error of each against TF, what `choose_cpu_lowering` picks and its ratio to TF.
Timings are interleaved (TF, XLA, candidates, TF, ...) and medians reported.

  python benchmarks/conv_lowering_bench.py [--batch 2,32] [--repeats 7] [--only vgg,resnet,inception]
                                           [--grad]   # time value-and-grad (training) instead
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

# (family, H, W, Cin, Cout, kh, kw, stride)
SHAPES = [
    ("vgg", 224, 224, 64, 64, 3, 3, 1),
    ("vgg", 112, 112, 128, 128, 3, 3, 1),
    ("vgg", 56, 56, 256, 256, 3, 3, 1),
    ("vgg", 28, 28, 512, 512, 3, 3, 1),
    ("vgg", 14, 14, 512, 512, 3, 3, 1),
    ("resnet", 56, 56, 64, 64, 3, 3, 1),
    ("resnet", 28, 28, 128, 128, 3, 3, 1),
    ("resnet", 14, 14, 256, 256, 3, 3, 1),
    ("resnet", 7, 7, 512, 512, 3, 3, 1),
    ("resnet", 56, 56, 128, 128, 3, 3, 2),
    ("resnet", 28, 28, 256, 256, 3, 3, 2),
    ("resnet", 14, 14, 512, 512, 3, 3, 2),
    ("inception", 147, 147, 32, 64, 3, 3, 1),
    ("inception", 35, 35, 64, 96, 3, 3, 1),
    ("inception", 35, 35, 288, 384, 3, 3, 2),
    ("inception", 17, 17, 128, 128, 1, 7, 1),
    ("inception", 17, 17, 192, 192, 7, 1, 1),
    ("inception", 8, 8, 384, 384, 1, 3, 1),
]


class _Spec:
  """An NHWC, SAME-padded `nn._ConvSpec`."""

  def __new__(cls, stride: int):
    from jaxport.convert.ops import nn
    attrs = dict(strides=[1, stride, stride, 1], padding="SAME", data_format="NHWC")
    return nn._ConvSpec(lambda name, default=None: attrs.get(name, default), 2)


def _time(fn):
  """Runs `fn()` (which blocks) once; returns (wall seconds, process CPU seconds over all threads)."""
  wall, cpu = time.perf_counter(), time.process_time()
  fn()
  return time.perf_counter() - wall, time.process_time() - cpu


def bench_shape(shape, batch, repeats, grad, candidates):
  import jax
  import jax.numpy as jnp
  import tensorflow as tf
  from jaxport.convert.ops import conv_lowering as cl

  _, h, wd, cin, cout, kh, kw, stride = shape
  rs = np.random.RandomState(0)
  x = rs.normal(size=(batch, h, wd, cin)).astype(np.float32)
  w = (rs.normal(size=(kh, kw, cin, cout)) / np.sqrt(kh * kw * cin)).astype(np.float32)
  spec = _Spec(stride)
  strides = [1, stride, stride, 1]
  tx, tw = tf.constant(x), tf.constant(w)
  if grad:
    @tf.function
    def tf_fn(x, w):
      with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = tf.nn.conv2d(x, w, strides, "SAME")
        loss = tf.reduce_sum(y * y)
      return tape.gradient(loss, [x, w])
  else:
    tf_fn = tf.function(lambda x, w: tf.nn.conv2d(x, w, strides, "SAME"))
  expected = tf_fn(tx, tw)
  expected = [e.numpy() for e in expected] if grad else [expected.numpy()]

  fns = {}
  for name in candidates:
    lowering = cl.LOWERINGS[name]
    if name.startswith("winograd") and (stride != 1 or (kh, kw) != (3, 3)):
      continue
    f = lambda x, w, lowering=lowering: lowering(x, w, spec)
    if grad:
      f = jax.grad(lambda x, w, f=f: jnp.sum(f(x, w) ** 2), argnums=(0, 1))
    fns[name] = jax.jit(f)
  chosen = cl.choose_cpu_lowering(x, w, spec)
  chosen_name = next((k for k, v in cl.LOWERINGS.items() if v is chosen), "xla")

  jx, jw = jnp.asarray(x), jnp.asarray(w)
  errors = {}
  for name, f in fns.items():
    out = f(jx, jw)
    out = [np.asarray(o) for o in out] if grad else [np.asarray(out)]
    errors[name] = max(float(np.max(np.abs(o - e)) / (np.max(np.abs(e)) + 1e-30)) for o, e in zip(out, expected))
  times = {"tf": [], **{k: [] for k in fns}}
  for _ in range(repeats):
    times["tf"].append(_time(lambda: [t.numpy() for t in tf.nest.flatten(tf_fn(tx, tw))]))
    for name, f in fns.items():
      times[name].append(_time(lambda f=f: jax.block_until_ready(f(jx, jw))))
  wall = {k: 1e3 * float(np.median([t[0] for t in v])) for k, v in times.items()}
  cpu = {k: 1e3 * float(np.median([t[1] for t in v])) for k, v in times.items()}
  return wall, cpu, errors, chosen_name


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--batch", default="2,32")
  parser.add_argument("--repeats", type=int, default=7)
  parser.add_argument("--only", default="vgg,resnet,inception")
  parser.add_argument("--candidates", default="xla,shifted,im2col,winograd2,winograd4")
  parser.add_argument("--grad", action="store_true", help="time value-and-grad (a training step)")
  parser.add_argument("--max-pixels", type=int, default=0,
                      help="skip shapes with batch*H*W above this (0: no limit)")
  args = parser.parse_args()
  families = set(args.only.split(","))
  candidates = args.candidates.split(",")
  cols = ["tf", *candidates]
  print(f"{'shape (ms: wall, process CPU)':<38}" + "".join(f"{c:>11}" for c in cols) + f"{'chosen':>11}{'/TF':>7}  max rel err")
  for batch in [int(b) for b in args.batch.split(",")]:
    for shape in SHAPES:
      if shape[0] not in families:
        continue
      _, h, wd, cin, cout, kh, kw, stride = shape
      if args.max_pixels and batch * h * wd > args.max_pixels:
        continue
      wall, cpu, errors, chosen = bench_shape(shape, batch, args.repeats, args.grad, candidates)
      label = f"b{batch} {h}x{wd}x{cin}->{cout} {kh}x{kw}/s{stride}"
      err = " ".join(f"{k}={v:.0e}" for k, v in errors.items() if k != "xla")
      for kind, med in [("wall", wall), ("cpu", cpu)]:
        row = "".join(f"{med[c]:>11.2f}" if c in med else f"{'-':>11}" for c in cols)
        ratio = med.get(chosen, med["xla"]) / med["tf"]
        print(f"{label + ' ' + kind:<38}{row}{chosen:>11}{ratio:>7.2f}  {err if kind == 'cpu' else ''}", flush=True)


if __name__ == "__main__":
  main()
