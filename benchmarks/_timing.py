"""Steady-state timing shared by the benchmarks: blocked calls, interleaved across systems."""
from __future__ import annotations

import statistics
import time

import numpy as np


def block(out):
  """`out` once computed: JAX arrays blocked on, TF tensors read."""
  import jax
  for leaf in jax.tree.leaves(out):
    leaf.block_until_ready() if hasattr(leaf, "block_until_ready") else np.asarray(leaf)
  return out


def timed(fn):
  """A runner that makes one blocked call of `fn` and returns its seconds."""

  def run() -> float:
    start = time.perf_counter()
    block(fn())
    return time.perf_counter() - start
  return run


def best_of(fn, *args, n: int = 3) -> float:
  """The fastest of `n` blocked calls `fn(*args)`, in seconds."""
  run = timed(lambda: fn(*args))
  return min(run() for _ in range(n))


def interleaved(runners: dict, repeats: int) -> dict[str, float]:
  """Median seconds per runner (each returns its own seconds), timed round by round (A, B, C, A, B, C,
  ...) after one warm-up round.

  Every timed call follows an untimed call of the same runner: the call after another system's finds
  cold caches and sleeping thread pools, which biased whichever runner came first in a round (two
  identical jaxport programs differed by up to 1.24x on the Transformer block).
  """
  for run in runners.values():
    run()
  times: dict[str, list[float]] = {k: [] for k in runners}
  for _ in range(repeats):
    for name, run in runners.items():
      run()
      times[name].append(run())
  return {k: statistics.median(v) for k, v in times.items()}
