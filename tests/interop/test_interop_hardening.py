"""Bad or unusual inputs (issue 14): typed errors or the right result, never a crash."""
import ctypes
import os
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import torch

from jaxport import interop
from jaxport.errors import DeletedArrayError, InteropInputError, JaxportError, ZeroCopyError

TARGETS = {"numpy": interop.to_numpy, "jax": interop.to_jax, "torch": interop.to_torch,
           "tf": interop.to_tf}


def _run(code: str) -> subprocess.CompletedProcess:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                        text=True, timeout=240, check=False, env=env)


@pytest.mark.slow  # a fresh interpreter importing jaxport: ~15 s on a loaded 2-core machine
def test_read_only_memmap_into_torch_is_copied_before_dlpack_and_writable(tmp_path):
  # Shared, a write through the tensor hit the read-only mapping: SIGSEGV. In a subprocess.
  path = tmp_path / "values.bin"
  np.arange(6, dtype=np.float32).tofile(path)
  done = _run(f"""
      import numpy as np
      from jaxport import interop
      mapped = np.memmap({str(path)!r}, dtype=np.float32, mode="r", shape=(6,))
      tensor = interop.to_torch(mapped)
      tensor += 1
      assert tensor.tolist() == [1, 2, 3, 4, 5, 6] and mapped.tolist() == [0, 1, 2, 3, 4, 5]
      print("OK")
  """)
  assert done.returncode == 0 and done.stdout.strip().endswith("OK"), (done.returncode,
                                                                      done.stderr[-3000:])


def test_read_only_memmap_plans_a_read_only_copy_and_copy_false_refuses(tmp_path):
  path = tmp_path / "values.bin"
  np.arange(6, dtype=np.float32).tofile(path)
  mapped = np.memmap(path, dtype=np.float32, mode="r", shape=(6,))
  plan = interop.explain(mapped, "torch")
  assert not plan.zero_copy and [r.kind for r in plan.reasons] == ["read-only"]
  with pytest.raises(ZeroCopyError, match="read-only") as raised:
    interop.to_torch(mapped, copy=False)
  assert isinstance(raised.value, JaxportError) and isinstance(raised.value, BufferError)
  # Targets that never write, or that mark views read-only, still share.
  assert interop.shares_memory(interop.to_jax(mapped), mapped)
  view = interop.to_numpy(mapped)
  assert interop.shares_memory(view, mapped) and not view.flags.writeable
  # Bytes are immutable Python objects: copied into torch too.
  frozen = np.frombuffer(bytes(range(8)), np.uint8)
  assert not interop.shares_memory(interop.to_torch(frozen), frozen)


def test_read_only_views_of_writable_numpy_memory_still_share_with_torch():
  base = np.zeros((3, 1), np.float32)
  broadcast = np.broadcast_to(base, (3, 4))
  assert interop.shares_memory(interop.to_torch(broadcast), base)
  flagged = np.arange(4.0)
  flagged.flags.writeable = False
  assert interop.shares_memory(interop.to_torch(flagged), flagged)
  assert any("cannot mark" in note for note in interop.explain(flagged, "torch").notes)


@pytest.mark.parametrize("target", TARGETS)
def test_deleted_jax_array_raises_typed_error(target):
  x = jnp.arange(4.0)
  x.delete()
  with pytest.raises(DeletedArrayError, match="deleted jax.Array.*before deleting") as raised:
    TARGETS[target](x)
  assert isinstance(raised.value, ValueError)
  with pytest.raises(DeletedArrayError):
    interop.explain(x, target)


def _foreign_capsule() -> object:
  new = ctypes.pythonapi.PyCapsule_New
  new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
  return new(ctypes.c_void_p(8), b"not_dlpack", None)


class _ReturnsNoCapsule:
  def __dlpack__(self, **unused):
    return 5

  def __dlpack_device__(self):
    return (1, 0)


class _NoDevice:
  def __dlpack__(self, **unused):
    return np.zeros(2).__dlpack__()


@pytest.mark.parametrize("target", TARGETS)
def test_non_dlpack_capsules_and_objects_raise_typed_errors(target):
  convert = TARGETS[target]
  cases = [(_foreign_capsule(), "Not a DLPack capsule.*not_dlpack.*pass the array itself"),
           (_ReturnsNoCapsule(), "does not keep the DLPack protocol"),
           (_NoDevice(), "no valid __dlpack_device__"),
           (object(), "not an array.*np.asarray"),
           ("text", "not an array")]
  for value, message in cases:
    with pytest.raises(InteropInputError, match=message):
      convert(value)
  used = np.zeros(2).__dlpack__()
  interop.to_numpy(used)
  with pytest.raises(DeletedArrayError, match="already consumed"):
    convert(used)


@pytest.mark.parametrize("target", TARGETS)
def test_big_endian_arrays_raise_typed_error_with_the_fix(target):
  for dtype in (">f4", ">i8", ">c8"):
    x = np.arange(3).astype(dtype)
    with pytest.raises(InteropInputError, match=r"non-native byte order.*newbyteorder\('='\)"):
      TARGETS[target](x)
    fixed = TARGETS[target](x.astype(x.dtype.newbyteorder("=")))
    assert interop.to_numpy(fixed).real.tolist() == [0, 1, 2]


@pytest.mark.filterwarnings("ignore:ComplexHalf")
def test_unsupported_dtypes_of_every_framework_are_typed():
  for value in (np.array(["a"]), tf.constant(["a"]), jnp.zeros(2, jnp.int4)):
    with pytest.raises(InteropInputError):
      interop.to_torch(value)
  with pytest.raises(InteropInputError):
    interop.to_jax(torch.zeros(2, dtype=torch.complex32))
