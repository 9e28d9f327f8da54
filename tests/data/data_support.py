"""Shared helpers of the jaxport.data tests."""
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import jax
import numpy as np


def host(tree):
  """A batch as nested NumPy arrays, for comparisons."""
  return jax.tree.map(np.asarray, tree)


def assert_batches_equal(actual, expected):
  assert len(actual) == len(expected), (len(actual), len(expected))
  for number, (a, e) in enumerate(zip(actual, expected)):
    a, e = host(a), host(e)
    assert jax.tree.structure(a) == jax.tree.structure(e), (number, a, e)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(e)):
      np.testing.assert_array_equal(x, y, err_msg=f"batch {number}")


def spy_on_to_jax(monkeypatch) -> list:
  """Records the type of every leaf the loader converts to a jax.Array (without a sharding), and
  checks that the array shares the leaf's memory."""
  from jaxport.data import _transfer
  from jaxport.interop import shares_memory
  seen = []
  make = _transfer.jax_leaf_converter

  def spying_converter(*args, **kwargs):
    convert = make(*args, **kwargs)

    def spy(x):
      y = convert(x)
      assert shares_memory(x, y), f"the {type(x).__name__} leaf was copied"
      seen.append(type(x))
      return y
    return spy

  monkeypatch.setattr(_transfer, "jax_leaf_converter", spying_converter)
  return seen


class ReadAheadProbe:
  """Tells, without a clock, whether a loader reads ahead while the training step runs.

  The source calls `produced(i)` as it makes element i. Inside step k the consumer works for
  `STEP_WORK_S` (so the loader sees a training step, not a consumer waiting on data, which it
  serves inline), then waits (up to `wait_s`) for element k + 1 to appear: a loader that reads
  ahead makes it meanwhile; a serial one cannot, since nobody asks for it before the step ends.
  A slow machine only lengthens the step, never flips the answer.
  """

  STEP_WORK_S = 2e-3  # well above the loader's threshold for "working" (_prefetch._WORKING_S)

  def __init__(self, n: int):
    from jaxport.data import _prefetch  # pylint: disable=import-outside-toplevel
    assert self.STEP_WORK_S >= 5 * _prefetch._WORKING_S  # pylint: disable=protected-access
    self._made = [threading.Event() for _ in range(n)]

  def produced(self, i: int) -> None:
    self._made[int(i)].set()

  def steps_that_overlapped(self, batches, wait_s: float) -> list[bool]:
    overlapped = []
    for k, _ in enumerate(batches):
      time.sleep(self.STEP_WORK_S)
      if k + 1 < len(self._made):
        overlapped.append(self._made[k + 1].wait(wait_s))
    return overlapped


def run_workers(script: pathlib.Path, argvs: list[list[str]], timeout_s: float) -> list[dict]:
  """Runs `script` once per argv, all at once (e.g. the processes of one jax.distributed job),
  and returns the JSON each printed on its last line; kills them all if one fails or hangs."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(
      [str(script.parent), os.environ.get("PYTHONPATH", "")])}
  workers = [subprocess.Popen([sys.executable, str(script), *argv], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for argv in argvs]
  reports = []
  try:
    for worker in workers:
      out, err = worker.communicate(timeout=timeout_s)
      assert worker.returncode == 0, err[-3000:]
      reports.append(json.loads(out.strip().splitlines()[-1]))
  finally:
    for worker in workers:
      if worker.poll() is None:
        worker.kill()
        worker.wait()
  return reports
