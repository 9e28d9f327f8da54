"""jaxport.interop works without TensorFlow, PyTorch or CuPy, and imports them only on demand."""
import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                        text=True, timeout=300, check=False, env={"JAX_PLATFORMS": "cpu",
                                                                  "PATH": ""})


def test_works_with_torch_tensorflow_and_cupy_missing():
  done = _run("""
      import sys
      for name in ("torch", "tensorflow", "cupy"):
        sys.modules[name] = None  # makes `import name` fail
      import numpy as np, jax.numpy as jnp
      from jaxport import interop
      x = np.arange(6, dtype=np.float32)
      y = interop.to_jax({"a": x, "b": [jnp.ones(2)]})
      assert np.asarray(y["a"]).tolist() == x.tolist()
      back = interop.to_numpy(y["b"][0])
      assert interop.shares_memory(back, y["b"][0]) and interop.explain(x, "jax") is not None
      for convert, package in ((interop.to_torch, "torch"), (interop.to_tf, "tensorflow"),
                               (interop.to_cupy, "cupy")):
        try:
          convert(x)
        except ImportError as error:
          assert package in str(error), error
        else:
          raise AssertionError(package)
      print("OK")
  """)
  assert done.stdout.strip().endswith("OK"), done.stderr[-3000:]


def test_frameworks_are_imported_only_when_needed():
  done = _run("""
      import sys
      import numpy as np
      from jaxport import interop
      interop.to_jax(np.ones(3, np.float32))
      assert not {"torch", "tensorflow", "cupy"} & set(sys.modules), sorted(sys.modules)
      interop.to_torch(np.ones(3, np.float32))
      assert "torch" in sys.modules and "tensorflow" not in sys.modules
      print("OK")
  """)
  assert done.stdout.strip().endswith("OK"), done.stderr[-3000:]
