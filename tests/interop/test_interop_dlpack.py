"""The DLPack layer: devices, capsule reading and relabelling, layout classes, address ranges."""
import datetime

import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import ml_dtypes
import numpy as np
import pytest
import torch

from jaxport import interop
from jaxport.interop import _base, _dlpack
import interop_support as S


@pytest.mark.parametrize("spec,device", [
    ("cpu", (1, 0)), ("cuda:1", (2, 1)), ("gpu", (2, 0)), ("/GPU:3", (2, 3)), ("rocm:0", (10, 0)),
    ("/job:localhost/replica:0/task:0/device:CPU:0", (1, 0)), ("CUDA_HOST:0", (3, 0))])
def test_parse_device(spec, device):
  assert _dlpack.parse_device(spec) == device
  assert _dlpack.parse_device(_dlpack.device_name(device)) == device


@pytest.mark.parametrize("spec", ["tpu:0", "cuda:x", ""])
def test_parse_device_rejects(spec):
  with pytest.raises(ValueError, match="Unknown device"):
    _dlpack.parse_device(spec)


@pytest.mark.parametrize("dtype", [d for d in S.DTYPES if d not in ("bfloat16",) and
                                   not d.startswith("float8")])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "negative", "strided"])
def test_read_capsule_matches_numpy(dtype, layout):
  x = S.make("numpy", layout, S.values(S.DTYPES[dtype]))
  info = _dlpack.read_capsule(x.__dlpack__())
  item = x.dtype.itemsize
  assert info.address == x.__array_interface__["data"][0]
  assert info.shape == x.shape and info.dtype == x.dtype and info.device == (1, 0)
  assert info.strides is None or info.strides == tuple(s // item for s in x.strides)
  assert not info.versioned and not info.read_only


def test_read_capsule_versioned_read_only_and_exotic_dtypes():
  x = np.broadcast_to(np.arange(4, dtype=np.int16), (3, 4))
  info = _dlpack.read_capsule(x.__dlpack__(max_version=(1, 0)))
  assert info.versioned and info.read_only and info.strides == (0, 1)
  for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
    t = torch.zeros(3, dtype=getattr(torch, name))
    assert _dlpack.read_capsule(torch.utils.dlpack.to_dlpack(t)).dtype == S.DTYPES[name]


def test_retag_is_a_zero_copy_bitcast():
  bits = S.aligned(np.array([1.0, -2.5, 3.0], ml_dtypes.bfloat16)).view(np.uint16)
  t = torch.from_dlpack(_dlpack.Retagged(bits, S.DTYPES["bfloat16"]))
  assert t.dtype == torch.bfloat16 and t.data_ptr() == bits.ctypes.data
  assert t.tolist() == [1.0, -2.5, 3.0]
  with pytest.raises(AssertionError, match="8-bit"):
    _dlpack.retag(np.zeros(2, np.uint8).__dlpack__(), S.DTYPES["bfloat16"])


def test_capsule_errors():
  capsule = np.zeros(2, np.float32).__dlpack__()
  torch.from_dlpack(capsule)
  with pytest.raises(ValueError, match="already consumed"):
    _dlpack.read_capsule(capsule)
  with pytest.raises(TypeError, match="Not a DLPack capsule"):
    _dlpack.read_capsule(datetime.datetime_CAPI)


def _offsets(shape, strides):
  grids = np.meshgrid(*[np.arange(n) * s for n, s in zip(shape, strides)], indexing="ij")
  return sum(grids).reshape(-1) if grids else np.zeros(1, int)


@st.composite
def views(draw, base=None):
  """A view of (a prefix of) `base`: transposed, sliced with any steps (reversals included),
  offset, broadcast."""
  shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=4))
  size = int(np.prod(shape))
  base = np.arange(size, dtype=np.int32) if base is None else base
  start = draw(st.integers(0, base.size - size))
  x = base[start:start + size].reshape(shape)
  x = x.transpose(draw(st.permutations(range(x.ndim))))
  index = tuple(slice(None, None, draw(st.sampled_from([1, 2, -1, -2]))) for _ in range(x.ndim))
  x = x[index]
  if draw(st.booleans()):
    x = np.broadcast_to(x[..., :1], x.shape[:-1] + (draw(st.integers(1, 3)),))
  return x


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(views())
def test_classify_against_element_offsets(x):
  strides = tuple(s // x.itemsize for s in x.strides)
  offsets = _offsets(x.shape, strides)
  layout = _base.classify(x.shape, strides)
  compact = np.array_equal(np.sort(offsets), np.arange(x.size)) or x.size == 0
  row_major = np.array_equal(offsets, np.arange(x.size)) or x.size == 0
  negative = any(s < 0 for s, n in zip(strides, x.shape) if n > 1)
  assert (layout == _base.ROW_MAJOR) == row_major
  if not row_major:
    assert (layout == _base.NEGATIVE) == negative
    assert (layout == _base.PERMUTED) == (compact and not negative)
    assert (layout == _base.STRIDED) == (not compact and not negative)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(st.data())
def test_shares_memory_is_bounds_overlap(data):
  base = np.arange(128, dtype=np.int32)
  a, b = data.draw(views(base)), data.draw(views(base))
  assert interop.shares_memory(a, b) == np.may_share_memory(a, b)
  base = np.arange(64, dtype=np.int32)
  lo = np.lib.stride_tricks.as_strided(base[5:], shape=(3,), strides=(8,))
  assert interop.shares_memory(lo, base[9:10]) and not interop.shares_memory(lo, base[:5])


def test_shares_memory_across_frameworks():
  x = S.aligned(np.arange(8, dtype=np.float32))
  t = torch.from_numpy(x)
  assert interop.shares_memory(t[4:], x[6:]) and not interop.shares_memory(t[:4], x[4:])
  assert not interop.shares_memory(x[:0], x)
  assert not interop.shares_memory(3.0, x)
