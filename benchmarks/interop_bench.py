"""Interop benchmark: per-call time of jaxport's to_* vs the raw DLPack import and a naive copy.

For each pair and array size (1 KiB ... 1 GiB): `jaxport.interop.to_<target>(x)`, the raw
`from_dlpack` call of the target framework, and the naive `np.asarray` -> framework copy. Times are
medians within this run. Prints a table, checks the targets (zero-copy time flat in size, at most
20% over raw `jax.dlpack.from_dlpack`, a 100-leaf pytree under 2 ms), writes
benchmarks/out/interop_bench.png.

  python benchmarks/interop_bench.py [--max-mib 1024] [--samples 7]
"""
from __future__ import annotations

import argparse
import functools
import gc
import os
import pathlib
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

KIB = 1024


def aligned_zeros(nbytes: int) -> np.ndarray:
  """float32 zeros starting on a 64-byte boundary (what JAX and TF need to share a buffer)."""
  raw = np.zeros(nbytes + 64, np.uint8)
  start = (-raw.ctypes.data) % 64
  return raw[start:start + nbytes].view(np.float32)


def per_call(fn, samples: int) -> float:
  """Median seconds per call; fast calls are looped so each sample lasts about a millisecond."""
  start = time.perf_counter()
  fn()
  once = time.perf_counter() - start
  loops = max(1, min(2000, int(1e-3 / max(once, 1e-9))))
  times = []
  for _ in range(samples if once < 0.05 else max(3, samples // 2)):
    start = time.perf_counter()
    for _ in range(loops):
      fn()
    times.append((time.perf_counter() - start) / loops)
  return statistics.median(times)


def pairs():
  """(name, make source from float32 NumPy, jaxport call, raw DLPack import, naive copy)."""
  import tensorflow as tf
  import torch
  from jaxport import interop

  tf_import = tf.experimental.dlpack.from_dlpack
  return [
      ("numpy→jax", lambda a: a, interop.to_jax, jax.dlpack.from_dlpack,
       lambda x: jnp.array(np.asarray(x))),
      ("torch→jax", torch.from_numpy, interop.to_jax, jax.dlpack.from_dlpack,
       lambda x: jnp.array(np.asarray(x))),
      ("tf→jax", tf.constant, interop.to_jax, jax.dlpack.from_dlpack,
       lambda x: jnp.array(np.asarray(x))),
      ("jax→torch", jax.device_put, interop.to_torch, torch.from_dlpack,
       lambda x: torch.tensor(np.asarray(x))),
      ("jax→numpy", jax.device_put, interop.to_numpy, np.from_dlpack,
       lambda x: np.array(x)),
      ("numpy→tf", lambda a: a, interop.to_tf, lambda x: tf_import(x.__dlpack__()),
       lambda x: tf.constant(np.asarray(x))),
      ("torch→numpy", torch.from_numpy, interop.to_numpy, np.from_dlpack,
       lambda x: np.array(np.asarray(x))),
  ]


def run_sizes(sizes: list[int], samples: int) -> list[dict]:
  from jaxport import interop
  rows = []
  for name, make, ours, raw, naive in pairs():
    for nbytes in sizes:
      source = make(aligned_zeros(nbytes))
      assert interop.shares_memory(ours(source), source), f"{name} copied at {nbytes} bytes"
      row = {"pair": name, "bytes": nbytes}
      for method, call in (("jaxport", ours), ("raw", raw), ("naive", naive)):
        row[method] = per_call(functools.partial(call, source), samples)
      rows.append(row)
      del source  # frees the buffer before the next size
      gc.collect()
  return rows


def run_pytrees(samples: int) -> dict[str, float]:
  import tensorflow as tf
  import torch
  from jaxport import interop
  leaves = [aligned_zeros(KIB) for _ in range(100)]
  trees = {"numpy": {f"leaf{i}": a for i, a in enumerate(leaves)},
           "torch": {f"leaf{i}": torch.from_numpy(a) for i, a in enumerate(leaves)},
           "tf": {f"leaf{i}": tf.constant(a) for i, a in enumerate(leaves)}}
  return {kind: per_call(lambda t=tree: interop.to_jax(t), samples) for kind, tree in trees.items()}


def size_label(nbytes: int) -> str:
  for unit, scale in (("GiB", KIB ** 3), ("MiB", KIB ** 2), ("KiB", KIB)):
    if nbytes >= scale:
      return f"{nbytes // scale} {unit}"
  return f"{nbytes} B"


def report(rows: list[dict], trees: dict[str, float], out: pathlib.Path) -> bool:
  from rich.console import Console
  from rich.table import Table
  console = Console()
  table = Table(title="jaxport.interop per-call time (µs, median)")
  for column in ("pair", "size", "jaxport", "raw from_dlpack", "naive copy", "vs raw"):
    table.add_column(column, justify="left" if column == "pair" else "right")
  for row in rows:
    table.add_row(row["pair"], size_label(row["bytes"]), f"{row['jaxport'] * 1e6:,.1f}",
                  f"{row['raw'] * 1e6:,.1f}", f"{row['naive'] * 1e6:,.1f}",
                  f"{row['jaxport'] / row['raw']:.2f}×")
  console.print(table)

  checks = Table(title="targets")
  for column in ("target", "measured", "ok"):
    checks.add_column(column)
  ok_all = True

  def check(label: str, measured: str, ok: bool):
    nonlocal ok_all
    ok_all &= ok
    checks.add_row(label, measured, "yes" if ok else "NO")

  for name in dict.fromkeys(r["pair"] for r in rows):
    series = [r for r in rows if r["pair"] == name]
    flat = series[-1]["jaxport"] / series[0]["jaxport"]
    largest, smallest = size_label(series[-1]["bytes"]), size_label(series[0]["bytes"])
    check(f"{name}: {largest} within 2× of {smallest}", f"{flat:.2f}×", flat <= 2.0)
  for name in ("numpy→jax", "torch→jax", "tf→jax"):
    series = [r for r in rows if r["pair"] == name]
    ratio = statistics.median(r["jaxport"] / r["raw"] for r in series)
    check(f"{name}: ≤ 1.2× raw jax.dlpack.from_dlpack (median over sizes)", f"{ratio:.2f}×",
          ratio <= 1.2)
  for kind, seconds in trees.items():
    check(f"100-leaf {kind} pytree → jax < 2 ms", f"{seconds * 1e3:.2f} ms", seconds < 2e-3)
  console.print(checks)
  plot(rows, out)
  console.print(f"plot: {out}")
  return ok_all


def plot(rows: list[dict], out: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = list(dict.fromkeys(r["pair"] for r in rows))
  cols = 4
  fig, axes = plt.subplots((len(names) + cols - 1) // cols, cols, figsize=(4.2 * cols, 7),
                           sharex=True, sharey=True, squeeze=False)
  for ax, name in zip(axes.flat, names):
    series = [r for r in rows if r["pair"] == name]
    sizes = [r["bytes"] for r in series]
    for key, style in (("jaxport", "o-"), ("raw", "s--"), ("naive", "^:")):
      ax.loglog(sizes, [r[key] * 1e6 for r in series], style, label=key)
    ax.set_title(name)
    ax.grid(True, which="major", alpha=0.3)
  for ax in axes.flat[len(names):]:
    ax.axis("off")
  for ax in axes[-1]:
    ax.set_xlabel("array size (bytes)")
  for ax in axes[:, 0]:
    ax.set_ylabel("µs per call (median)")
  axes.flat[0].legend()
  fig.suptitle("jaxport.interop vs raw from_dlpack vs naive copy (CPU)")
  fig.tight_layout()
  out.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(out, dpi=120)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--max-mib", type=int, default=1024)
  parser.add_argument("--samples", type=int, default=7)
  parser.add_argument("--out", default=str(pathlib.Path(__file__).parent / "out" /
                                           "interop_bench.png"))
  args = parser.parse_args()
  sizes, nbytes = [], KIB
  while nbytes <= args.max_mib * KIB * KIB:
    sizes.append(nbytes)
    nbytes *= 8
  if sizes[-1] != args.max_mib * KIB * KIB:
    sizes.append(args.max_mib * KIB * KIB)
  rows = run_sizes(sizes, args.samples)
  trees = run_pytrees(args.samples)
  ok = report(rows, trees, pathlib.Path(args.out))
  print("all targets met" if ok else "some targets missed")


if __name__ == "__main__":
  main()
