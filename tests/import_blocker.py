"""Python source that makes imports fail as they do where a package is not installed, for the
subprocesses of tests that check a path works without TensorFlow (as on the GPU device, or for a
user loading an artifact). An import hook, not a None entry in sys.modules: Keras tests
`"tensorflow" in sys.modules`."""


def block_imports(*packages: str) -> str:
  """Source that, run first in a process, makes importing `packages` (and their submodules) raise
  ModuleNotFoundError."""
  return f"""
import importlib.abc, sys
class _NotInstalled(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.partition(".")[0] in {tuple(packages)!r}:
      raise ModuleNotFoundError(f"No module named {{name!r}}")
sys.meta_path.insert(0, _NotInstalled())
"""


# `python -c WITHOUT_TF script.py args...` runs script.py as __main__ without TensorFlow.
WITHOUT_TF = block_imports("tensorflow") + """
import runpy
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_without(source: str, *args: str, packages=("tensorflow", "tf_keras", "keras"), timeout: int = 300):
  """Runs Python `source` with `args` in a CPU-only subprocess where `packages` cannot be imported;
  fails the test with its stderr when it fails."""
  import os
  import subprocess
  import sys
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  result = subprocess.run([sys.executable, "-c", block_imports(*packages) + source, *args],
                          capture_output=True, text=True, env={**env, "JAX_PLATFORMS": "cpu"}, timeout=timeout)
  assert result.returncode == 0, result.stderr[-3000:]
  return result
