"""Semantics beyond the matrix: pytrees, copy/writable rules, autograd, capsules, errors."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
import torch

from jaxport import interop
import interop_support as S

CONVERT = {"numpy": interop.to_numpy, "jax": interop.to_jax, "torch": interop.to_torch,
           "tf": interop.to_tf}


def test_pytree_structure_and_mixed_frameworks():
  tree = {"image": S.aligned(np.ones((2, 3), np.float32)),
          "label": torch.tensor([1, 2], dtype=torch.int32),
          "mask": jnp.array([True, False]),
          "nested": [tf.constant([1.5]), (None, np.float32(2.0))]}
  out = interop.to_torch(tree)
  assert set(out) == set(tree) and out["nested"][1][0] is None
  assert isinstance(out["nested"][1][1], torch.Tensor) and out["nested"][1][1].item() == 2.0
  assert all(isinstance(v, torch.Tensor) for v in (out["image"], out["label"], out["mask"]))
  assert out["label"] is tree["label"]  # same framework: the input itself
  assert interop.shares_memory(out["image"], tree["image"])
  assert interop.shares_memory(out["mask"], tree["mask"])
  plans = interop.explain(tree, "torch")
  assert plans["image"].zero_copy and not plans["nested"][1][1].zero_copy
  assert plans["nested"][1][1].reasons[0].kind == "no-buffer"


@pytest.mark.parametrize("target", CONVERT)
@pytest.mark.parametrize("source", ["numpy", "jax", "torch", "tf"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_copy_true_always_copies(source, target, dtype):
  expected = S.values(S.DTYPES[dtype])
  x = S.make(source, "contiguous", expected)
  y = CONVERT[target](x, copy=True)
  assert S.same_values(S.to_host(y), expected)
  assert S.address(y) != S.address(x) and not interop.shares_memory(x, y)
  plan = interop.explain(x, target, copy=True)
  assert not plan.zero_copy and plan.reasons[-1].kind == "requested"


@pytest.mark.parametrize("source", ["jax", "tf"])
def test_immutable_sources_give_read_only_numpy_views_or_writable_copies(source):
  x = S.make(source, "contiguous", S.values(S.DTYPES["float32"]))
  view = interop.to_numpy(x)
  assert interop.shares_memory(view, x) and not view.flags.writeable
  with pytest.raises(ValueError, match="read-only"):
    view[0, 0] = 1
  writable = interop.to_numpy(x, writable=True)
  assert writable.flags.writeable and not interop.shares_memory(writable, x)
  plan = interop.explain(x, "numpy", writable=True)
  assert [r.kind for r in plan.reasons] == ["read-only"]
  with pytest.raises(BufferError, match="read-only"):
    interop.to_numpy(x, writable=True, copy=False)


def test_jax_to_torch_shares_and_writable_copies():
  x = jnp.arange(6.0)
  shared = interop.to_torch(x)
  assert interop.shares_memory(shared, x)
  assert any("cannot mark tensors read-only" in n for n in interop.explain(x, "torch").notes)
  own = interop.to_torch(x, writable=True)
  assert not interop.shares_memory(own, x)
  own[0] = 42.0
  assert float(x[0]) == 0.0


def test_mutable_sources_share_writes_both_ways():
  array = S.aligned(np.zeros(4, np.float32))
  tensor = interop.to_torch(array)
  tensor[1] = 5.0
  assert array[1] == 5.0
  back = interop.to_numpy(tensor)
  assert back.flags.writeable
  back[2] = 7.0
  assert tensor[2].item() == 7.0
  jax_view = interop.to_jax(array)
  assert interop.shares_memory(jax_view, array)  # JAX sees the NumPy buffer (documented aliasing)


def test_read_only_numpy_into_immutable_and_mutable_targets():
  array = S.aligned(np.arange(8, dtype=np.float32))
  array.flags.writeable = False
  for target in ("jax", "tf"):
    y = CONVERT[target](array, copy=False)
    assert interop.shares_memory(y, array)
  t = interop.to_torch(array)
  assert interop.shares_memory(t, array)
  assert any("read-only" in n for n in interop.explain(array, "torch").notes)
  assert not interop.shares_memory(interop.to_torch(array, writable=True), array)
  assert not interop.shares_memory(interop.to_numpy(array, writable=True), array)
  assert interop.to_numpy(array) is array


@pytest.mark.parametrize("dtype,offset", [("int64", 0), ("float32", 4), ("bfloat16", 0)])
def test_read_only_numpy_exported_to_jax_before_jax_copies(dtype, offset):
  """JAX narrows 64-bit dtypes or realigns after importing: the read-only export must work."""
  array = S.aligned(S.values(S.DTYPES[dtype]), offset=offset)
  array.flags.writeable = False
  y = interop.to_jax(array)
  assert np.array_equal(np.asarray(y), array.astype(y.dtype))


def test_requires_grad_is_detached_explicitly():
  t = torch.arange(4.0, requires_grad=True)
  plan = interop.explain(t, "jax")
  assert plan.zero_copy and plan.detach and any("autograd" in n for n in plan.notes)
  for target in ("jax", "numpy", "tf"):
    y = CONVERT[target](t)
    assert S.same_values(S.to_host(y), np.arange(4.0, dtype=np.float32))
  assert interop.shares_memory(interop.to_jax(t), t)
  assert interop.to_torch(t) is t and t.requires_grad  # same framework: untouched
  assert t.grad is None


@pytest.mark.parametrize("lazy", ["conj", "neg"])
def test_torch_lazy_bits_are_applied(lazy):
  base = torch.tensor([1 + 2j, -3 - 4j], dtype=torch.complex64)
  if lazy == "conj":
    t, expected = base.conj(), np.array([1 - 2j, -3 + 4j], np.complex64)
  else:  # the imaginary part of a conjugate view is a negated view
    t, expected = base.conj().imag, np.array([-2, 4], np.float32)
  assert t.is_conj() or t.is_neg()
  plan = interop.explain(t, "numpy")
  assert plan.reasons[0].kind == "lazy" and not plan.zero_copy
  y = interop.to_numpy(t)
  np.testing.assert_array_equal(y, expected)
  with pytest.raises(BufferError, match="lazy"):
    interop.to_numpy(t, copy=False)


def test_capsules_convert_once_and_explain_does_not_consume():
  source = torch.arange(6, dtype=torch.bfloat16)
  capsule = torch.utils.dlpack.to_dlpack(source)
  assert interop.explain(capsule, "numpy").zero_copy
  y = interop.to_numpy(capsule)  # bfloat16 via a relabelled capsule
  assert y.dtype == ml_dtypes.bfloat16 and S.address(y) == source.data_ptr()
  for convert in CONVERT.values():
    with pytest.raises(ValueError, match="already consumed"):
      convert(capsule)


def test_versioned_read_only_capsule():
  array = S.aligned(np.arange(4, dtype=np.int32))
  array.flags.writeable = False
  capsule = array.__dlpack__(max_version=(1, 0))
  y = interop.to_numpy(capsule)
  assert not y.flags.writeable and S.address(y) == S.address(array)
  y = interop.to_jax(array.__dlpack__(max_version=(1, 0)))
  assert S.address(y) == S.address(array)


class Producer:
  """A minimal third-party DLPack producer."""

  def __init__(self, array):
    self.array = array

  def __dlpack__(self, **kwargs):
    return self.array.__dlpack__(**kwargs)

  def __dlpack_device__(self):
    return self.array.__dlpack_device__()


@pytest.mark.parametrize("target", CONVERT)
def test_foreign_dlpack_producer(target):
  array = S.aligned(np.arange(12, dtype=np.float32).reshape(3, 4))
  y = CONVERT[target](Producer(array))
  assert S.same_values(S.to_host(y), array) and S.address(y) == S.address(array)


def test_foreign_producer_on_an_unknown_gpu_raises_with_both_devices():
  class GpuProducer(Producer):
    """Claims CUDA device 0: jaxport must refuse before exporting anything to a consumer."""

    def __dlpack__(self, **unused_kwargs):
      return self.array.__dlpack__()

    def __dlpack_device__(self):
      return (2, 0)

  capsule_source = S.aligned(np.arange(3, dtype=np.float32))
  with pytest.raises(interop.DeviceMismatchError, match=r"cuda:0.*cpu"):
    interop.to_torch(GpuProducer(capsule_source))
  with pytest.raises(TypeError, match="its own library"):
    interop.to_numpy(GpuProducer(capsule_source), device="cpu")


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: quantized/complex32 are deprecated
@pytest.mark.parametrize("target", CONVERT)
@pytest.mark.parametrize("make", [
    lambda: tf.constant(["a", "b"]),
    lambda: np.array(["a", "b"]),
    lambda: np.array([object(), 1], dtype=object),
    lambda: np.zeros(2, dtype=[("a", np.int32)]),
    lambda: np.array(["2024-01-01"], dtype="datetime64[D]"),
    lambda: tf.Variable([1.0]).handle,
    lambda: tf.data.experimental.to_variant(tf.data.Dataset.range(2)),
    lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8),
    lambda: torch.ones(2, dtype=torch.complex32),
    lambda: "text",
    lambda: object(),
], ids=["tf-string", "np-str", "np-object", "np-struct", "np-datetime", "tf-resource",
        "tf-variant", "torch-quantized", "torch-complex32", "str", "object"])
def test_non_numeric_raise_type_error_before_dlpack(make, target):
  with pytest.raises(TypeError):
    CONVERT[target](make())
  with pytest.raises(TypeError):
    interop.explain(make(), target)


def test_python_scalars_copy():
  assert interop.to_jax(3).dtype == jnp.int32
  assert interop.to_torch(2.5).dtype == torch.float64
  assert interop.to_tf(True).dtype == tf.bool
  with pytest.raises(BufferError, match="no-buffer"):
    interop.to_numpy(1.0, copy=False)


def test_tf_variable_shares_its_current_value():
  var = tf.Variable(np.arange(4, dtype=np.float32))
  y = interop.to_numpy(var)
  assert interop.shares_memory(y, var.value())
  np.testing.assert_array_equal(y, np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("source", ["numpy", "torch", "tf"])
@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_x64_off_narrowing_refuses_values_that_do_not_fit(source, dtype):
  expected = np.array([1, 2**40], dtype=S.DTYPES[dtype])
  x = S.make(source, "contiguous", expected)
  with pytest.raises(OverflowError, match="jax_enable_x64"):
    interop.to_jax(x)


def test_device_request_the_framework_lacks():
  x = S.aligned(np.ones(3, np.float32))
  with pytest.raises(interop.DeviceMismatchError, match=r"cpu:0.*cuda:0|cuda:0.*cpu"):
    interop.to_torch(x, device="cuda:0")
  with pytest.raises(interop.DeviceMismatchError, match=r"cpu:0.*cuda:1|cuda:1.*cpu"):
    interop.to_tf(x, device="/GPU:1")
  with pytest.raises(interop.DeviceMismatchError, match="gpu:0"):
    interop.to_jax(x, device="gpu:0")
  with pytest.raises(interop.DeviceMismatchError, match="host memory"):
    interop.to_numpy(x, device="cuda:0")
  assert interop.to_torch(x, device="cpu", copy=False).data_ptr() == S.address(x)
  assert interop.shares_memory(interop.to_jax(x, device="cpu", copy=False), x)


def test_same_framework_options():
  x = S.aligned(np.ones(3, np.float32))
  assert interop.to_numpy(x) is x
  y = interop.to_numpy(x, copy=True)
  assert not interop.shares_memory(x, y)
  j = jnp.ones(3)
  assert interop.to_jax(j) is j
  assert interop.to_jax(j, device=jax.devices()[0]) is j


def test_explain_reads_well():
  text = str(interop.explain(np.ones((3, 4), np.float32)[:, ::2], "jax"))
  assert text.startswith("NumPy -> JAX: copies") and "strides:" in text and "steps:" in text


def test_shards_argument_is_checked():
  with pytest.raises(ValueError, match="shards"):
    interop.to_torch(np.ones(2), shards="all")


@pytest.mark.parametrize("target", CONVERT)
@pytest.mark.parametrize("source", ["numpy", "jax", "torch", "tf"])
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)])
def test_scalars_and_empty_arrays(source, target, shape):
  expected = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
  x = S.make(source, "contiguous", expected) if source != "numpy" else expected.copy()
  y = CONVERT[target](x)
  assert S.same_values(S.to_host(y), expected)
  if shape == ():  # a 0-d array has a buffer (unlike a scalar); empty arrays share no bytes
    assert interop.shares_memory(x, y) == interop.explain(x, target).zero_copy


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.uint8, tf.bool, tf.int64,
                                   tf.complex64])
def test_repeated_tf_conversions_reuse_one_plan_and_stay_exact(dtype):
  # The plan of an eager tensor depends on its dtype and device only, so it is made once; every
  # later tensor must still convert exactly, whatever its shape.
  for shape in [(6,), (2, 3), (0, 4), ()]:
    x = tf.cast(tf.reshape(tf.range(int(np.prod(shape))), shape), dtype)
    y = interop.to_jax(x)
    expected = x.numpy()
    if expected.dtype == np.int64:
      expected = expected.astype(np.int32)  # jax_enable_x64 is off
    assert y.shape == shape and y.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(y), expected)
    if expected.dtype == x.numpy().dtype and x.shape.num_elements():
      assert interop.shares_memory(x, y)


def test_reused_tf_plans_follow_the_x64_flag():
  assert interop.to_jax(tf.constant([1, 2], tf.int64)).dtype == jnp.int32
  with jax.enable_x64(True):
    assert interop.to_jax(tf.constant([1, 2], tf.int64)).dtype == jnp.int64
  assert interop.to_jax(tf.constant([1, 2], tf.int64)).dtype == jnp.int32


def test_copy_false_is_planned_per_tensor():
  x = tf.constant(np.arange(64, dtype=np.float32))
  interop.to_jax(x)  # a reusable plan for float32 tensors exists now
  y = interop.to_jax(x, copy=False)
  assert interop.shares_memory(x, y)


def test_jax_leaf_converter_matches_to_jax():
  from jaxport.interop.convert import jax_leaf_converter
  device = jax.devices("cpu")[0]
  convert = jax_leaf_converter(device)
  for leaf in (np.arange(16, dtype=np.float32), tf.range(5), torch.arange(3), jnp.ones(2)):
    y = convert(leaf)
    assert isinstance(y, jax.Array) and y.devices() == {device}
    np.testing.assert_array_equal(np.asarray(y), np.asarray(interop.to_numpy(leaf)))


def test_jax_leaf_converter_repeats_share_and_follow_x64():
  # Its cached runners (keyed by adapter, dtype, device and the x64 flag) must convert later
  # tensors exactly as the first: shared, of the right dtype, x64 toggles included.
  from jaxport.interop.convert import jax_leaf_converter
  convert = jax_leaf_converter(jax.devices("cpu")[0])
  for round_ in range(3):
    for dtype in (tf.float32, tf.uint8, tf.bfloat16):
      x = tf.cast(tf.range(8) + round_, dtype)
      y = convert(x)
      np.testing.assert_array_equal(np.asarray(y, np.float32), x.numpy().astype(np.float32))
      assert y.dtype == x.numpy().dtype and interop.shares_memory(x, y)
    wide = tf.constant([1, 2 + round_], tf.int64)
    assert convert(wide).dtype == jnp.int32
    with jax.enable_x64(True):
      assert convert(wide).dtype == jnp.int64 and interop.shares_memory(wide, convert(wide))
    variable = tf.Variable([1.0, float(round_)])  # no plan key: planned per call
    np.testing.assert_array_equal(np.asarray(convert(variable)), [1.0, round_])
