"""CUDA paths: CuPy, device arrays of torch/JAX/TF, devices and stream ordering.

Skipped (with the reason) on machines without a CUDA device and the CUDA builds involved.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxport import interop

pytestmark = pytest.mark.gpu


def _jax_gpus():
  try:
    return jax.devices("gpu")
  except RuntimeError:
    return []


needs_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                      reason="needs a CUDA build of torch and a CUDA device")
needs_jax_gpu = pytest.mark.skipif(not _jax_gpus(), reason="needs a GPU build of jax and a GPU")


@pytest.fixture(scope="module")
def cupy():
  module = pytest.importorskip("cupy", reason="CuPy is not installed")
  try:
    count = module.cuda.runtime.getDeviceCount()
  except module.cuda.runtime.CUDARuntimeError:
    count = 0
  if not count:
    pytest.skip("CuPy has no CUDA device")
  return module


def _slow_ones(device="cuda"):
  """Ones that exist only once the current stream has run 30 large matmuls (queued, not run)."""
  a = torch.full((2048, 2048), 1.0 / 2048, device=device)
  for _ in range(30):
    a = a @ a
  return a.sum(0)


def test_cupy_pairs_share_device_memory(cupy):
  x = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
  assert interop.explain(x, "cupy").zero_copy
  if torch.cuda.is_available():
    t = interop.to_torch(x)
    assert t.is_cuda and t.data_ptr() == x.data.ptr
    back = interop.to_cupy(t[:, ::2])  # strided views are shared too
    assert back.data.ptr == x.data.ptr and cupy.array_equal(back, x[:, ::2])
    reversed_view = x[::-1]
    assert not interop.explain(reversed_view, "torch").zero_copy  # torch has no negative strides
    expected = torch.from_numpy(x.get()[::-1].copy())
    assert torch.equal(interop.to_torch(reversed_view).cpu(), expected)
  if _jax_gpus():
    j = interop.to_jax(x)
    assert j.unsafe_buffer_pointer() == x.data.ptr
    assert interop.to_cupy(j).data.ptr == x.data.ptr


def test_cupy_host_transfers_need_device(cupy):
  host = np.arange(4, dtype=np.float32)
  with pytest.raises(interop.DeviceMismatchError, match="cpu:0"):
    interop.to_cupy(host)
  on_gpu = interop.to_cupy(host, device=0)
  assert cupy.asnumpy(on_gpu).tolist() == host.tolist()
  with pytest.raises(interop.DeviceMismatchError, match="cuda:0"):
    interop.to_numpy(on_gpu)
  assert interop.to_numpy(on_gpu, device="cpu").tolist() == host.tolist()
  with pytest.raises(BufferError, match="device"):
    interop.to_numpy(on_gpu, device="cpu", copy=False)
  with pytest.raises(TypeError, match="bfloat16"):
    interop.to_cupy(torch.zeros(2, dtype=torch.bfloat16, device="cuda"))


@needs_torch_cuda
def test_torch_cuda_to_numpy_and_tf():
  t = torch.arange(6.0, device="cuda")
  with pytest.raises(interop.DeviceMismatchError, match=r"cuda:0.*cpu"):
    interop.to_numpy(t)
  assert interop.to_numpy(t, device="cpu").tolist() == list(range(6))
  moved = interop.to_torch(np.ones(3, np.float32), device="cuda:0")
  assert moved.is_cuda


@needs_torch_cuda
def test_stream_order_torch_to_cupy(cupy):
  side = torch.cuda.Stream()
  with torch.cuda.stream(side):  # torch's current stream holds the pending producer work
    out = _slow_ones()
    y = interop.to_cupy(out)  # cupy passes its stream; torch orders its current stream first
    first = y * 1
  cupy.cuda.get_current_stream().synchronize()
  assert cupy.asnumpy(first).tolist() == [1.0] * 2048


@needs_torch_cuda
@needs_jax_gpu
def test_stream_order_torch_to_jax_and_back():
  side = torch.cuda.Stream()
  with torch.cuda.stream(side):
    y = interop.to_jax(_slow_ones())  # JAX passes its external-ready-events stream
    first = (y * 1).block_until_ready()
  np.testing.assert_array_equal(np.asarray(first), np.ones(2048, np.float32))
  z = jnp.arange(1e6, dtype=jnp.float32) * 3
  t = interop.to_torch(z)  # torch passes its current stream; JAX orders its pending work first
  assert torch.equal(t * 1, torch.arange(1e6, device="cuda", dtype=torch.float32) * 3)


@needs_torch_cuda
def test_stream_order_torch_to_tf_synchronises_the_producer():
  tf = pytest.importorskip("tensorflow")
  if not tf.config.list_logical_devices("GPU"):
    pytest.skip("TensorFlow sees no GPU")
  side = torch.cuda.Stream()
  with torch.cuda.stream(side):
    y = interop.to_tf(_slow_ones())  # TF takes no stream: jaxport synchronises torch's first
    first = (y * 1).numpy()
  np.testing.assert_array_equal(first, np.ones(2048, np.float32))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two CUDA devices")
def test_two_gpus_transfer_only_when_asked():
  t = torch.arange(4.0, device="cuda:1")
  y = interop.to_torch(t, device="cuda:0")
  assert y.device == torch.device("cuda:0")
  with pytest.raises(BufferError, match=r"cuda:1.*cuda:0"):
    interop.to_torch(t, device="cuda:0", copy=False)
