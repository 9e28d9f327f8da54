"""Array plumbing ops against TF: shapes, reshaping, padding, selection, reordering, sequences, diagonals."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from oracle import assert_close, check, run_rule

raw = tf.raw_ops
rs = np.random.RandomState(0)
X = rs.normal(size=(2, 3, 4)).astype(np.float32)
M = rs.normal(size=(2, 3, 4)).astype(np.float32)
V = rs.normal(size=(5,)).astype(np.float32)


def shape_of(x):
  return raw.Shape(input=x)   # tf.shape folds to a constant when the static shape is known


# --------------------------------------------------------------------------- shapes


def test_shape_size_rank_shape_n():
  check(lambda x: (shape_of(x), raw.Size(input=x), raw.Rank(input=x), raw.ShapeN(input=[x, x[0]])), X)


def test_shape_int64_out_type():
  with jax.enable_x64(True):
    check(lambda x: (raw.Shape(input=x, out_type=tf.int64), raw.Size(input=x, out_type=tf.int64)), X)


def test_shape_of_traced_input_is_numpy():
  seen = []

  def probe(x):
    seen.append(run_rule("Shape", x, out_type=np.int32))
    return x

  jax.jit(probe)(X)
  jax.vmap(probe)(X)
  assert [type(s) for s in seen] == [np.ndarray, np.ndarray]
  np.testing.assert_array_equal(seen[0], [2, 3, 4])
  np.testing.assert_array_equal(seen[1], [3, 4])   # per-example shape under vmap


def _shape_arithmetic(x):   # tf2jax's test_polymorphic_shape program
  shape = shape_of(x)
  new_shape = tf.stack([tf.pow(shape[0], 1), shape[1]], axis=0)
  out = tf.broadcast_to(tf.sin(x), new_shape)
  out = tf.concat([out] * 2, axis=0)
  out = tf.concat([out] * 2, axis=1)
  total = tf.cast(raw.Size(input=x), tf.float32) + tf.reduce_sum(tf.zeros(shape[:1]))
  return out / tf.cast(shape[0], tf.float32), shape, total


def test_shape_with_symbolic_dims_under_jax_export():
  tf_fn = tf.function(_shape_arithmetic, autograph=False)
  fn = jaxport.convert_functional(tf_fn, tf.TensorSpec((None, 4)))
  b, = jax.export.symbolic_shape("b")
  spec = jax.ShapeDtypeStruct((b, 4), np.float32)
  exported = jax.export.export(jax.jit(fn))(spec)
  assert [a.shape for a in exported.out_avals] == [(2 * b, 8), (2,), ()]
  loss = lambda x: jax.numpy.sum(fn(x)[0] ** 2)   # noqa: E731
  grad = jax.export.export(jax.jit(jax.grad(loss)))(spec)
  for n in (1, 3, 9):
    x = rs.normal(size=(n, 4)).astype(np.float32)
    for got, want in zip(exported.call(x), tf_fn(x)):
      assert_close(got, want.numpy(), atol=1e-6, rtol=1e-5)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
      tape.watch(xt)
      want = tf.reduce_sum(tf_fn(xt)[0] ** 2)
    assert_close(grad.call(x), tape.gradient(want, xt).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_gradient", [False, True])
def test_shape_with_symbolic_dims_jax2tf_round_trip(with_gradient):
  from jax.experimental import jax2tf
  tf_fn = tf.function(lambda x: _shape_arithmetic(x)[0], autograph=False)
  fn = jax.jit(jaxport.convert_functional(tf_fn, tf.TensorSpec((None, 4))))
  back = tf.function(jax2tf.convert(fn, polymorphic_shapes=["(b, _)"], with_gradient=with_gradient),
                     autograph=False).get_concrete_function(tf.TensorSpec((None, 4)))
  assert back.structured_outputs.shape.as_list() == [None, 8]
  x = rs.normal(size=(5, 4)).astype(np.float32)
  assert_close(back(x).numpy(), tf_fn(x).numpy(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("s0,s1", [([2, 1, 3], [1, 1]), ([1], [1]), ([], [2, 1]), ([4, 1], [3]),
                                   ([2, 3], [2, 3]), ([1, 3], [2, 1])])
def test_broadcast_args_and_gradient_args(s0, s1):
  a, b = np.zeros(s0, np.float32), np.zeros(s1, np.float32)
  check(lambda a, b: (raw.BroadcastArgs(s0=shape_of(a), s1=shape_of(b)),
                      *raw.BroadcastGradientArgs(s0=shape_of(a), s1=shape_of(b))), a, b, vmap=False)


def test_constant_shape_arithmetic_stays_numpy():
  packed = run_rule("Pack", np.int32(2), np.asarray(3, np.int32), axis=0, T=np.int32, N=2)
  joined = run_rule("ConcatV2", packed, np.asarray([-1], np.int32), np.int32(0), T=np.int32, N=2)
  sliced = run_rule("StridedSlice", joined, np.asarray([1]), np.asarray([2]), np.asarray([1]),
                    shrink_axis_mask=1)
  gathered = run_rule("GatherV2", joined, np.asarray([2, 0]), np.int32(0), batch_dims=0)
  ranged = run_rule("Range", np.int32(0), sliced, np.int32(1), Tidx=np.int32)
  for value, expected in [(packed, [2, 3]), (joined, [2, 3, -1]), (sliced, 3), (gathered, [-1, 2]),
                          (ranged, [0, 1, 2])]:
    assert type(value) is np.ndarray and value.dtype == np.int32
    np.testing.assert_array_equal(value, expected)


# --------------------------------------------------------------------------- reshaping, joining, splitting

RESHAPING = {
    "reshape": (lambda x: tf.reshape(x, [4, -1]), X),
    "reshape_scalar": (lambda v: tf.reshape(v[:1], []), V),
    "squeeze_dims": (lambda x: tf.squeeze(x[:, :1, :, None], axis=[1, -1]), X),
    "squeeze_all": (lambda x: tf.squeeze(x[:1, :, None]), X),
    "expand_dims": (lambda x: (tf.expand_dims(x, 1), tf.expand_dims(x, -1), tf.expand_dims(x, -4)), X),
    "transpose": (lambda x: tf.transpose(x, [2, 0, 1]), X),
    "pack": (lambda x, y: (tf.stack([x, y], axis=1), tf.stack([x, y], axis=-1)), X, M),
    "unpack": (lambda x: (tf.unstack(x, axis=1), tf.unstack(x, axis=-1)), X),
    "concat_v2": (lambda x, y: (tf.concat([x, y], axis=1), tf.concat([x, y, x], axis=-1)), X, M),
    "concat_v1": (lambda x, y: raw.Concat(concat_dim=2, values=[x, y]), X, M),
    "split": (lambda x: tf.split(x, 2, axis=-1), X),
    "split_v": (lambda x: tf.split(x, [1, -1, 2], axis=2), X),
    "tile": (lambda x: tf.tile(x, [2, 1, 3]), X),
    "broadcast_to": (lambda x: tf.broadcast_to(x[:, :1], [4, 2, 3, 4]), X),
    "fill_traced_value": (lambda v: tf.fill([2, 3], v[0]), V),
    "fill_int": (lambda x: tf.fill(shape_of(x)[1:], 7), X),
    # The same ops by their raw names.
    "Squeeze": (lambda x: raw.Squeeze(input=x[:, :1, :, None], axis=[1, -1]), X),
    "ExpandDims": (lambda x: (raw.ExpandDims(input=x, axis=-2), raw.ExpandDims(input=x, axis=0)), X),
    "Transpose": (lambda x: raw.Transpose(x=x, perm=[2, 0, 1]), X),
    "Unpack": (lambda x: (raw.Unpack(value=x, num=3, axis=1), raw.Unpack(value=x, num=4, axis=-1)), X),
    "Split": (lambda x: raw.Split(axis=-1, value=x, num_split=2), X),
    "Tile": (lambda x: raw.Tile(input=x, multiples=[2, 1, 3]), X),
    "BroadcastTo": (lambda x: raw.BroadcastTo(input=x[:, :1], shape=[4, 2, 3, 4]), X),
    "Fill": (lambda v: (raw.Fill(dims=[2, 3], value=v[0]), raw.Fill(dims=shape_of(v), value=7)), V),
}


@pytest.mark.parametrize("name", list(RESHAPING))
def test_reshaping(name):
  fn, *args = RESHAPING[name]
  check(fn, *args)


def test_conjugate_transpose():
  z = (X + 1j * M).astype(np.complex64)
  fn = jaxport.convert_functional(lambda z: raw.ConjugateTranspose(x=z, perm=[1, 0, 2]), z)
  expected = raw.ConjugateTranspose(x=z, perm=[1, 0, 2]).numpy()
  for got in (fn(z), jax.jit(fn)(z)):
    assert got.dtype == np.complex64
    np.testing.assert_array_equal(np.asarray(got), expected)   # oracle.check compares real parts only


def test_concat_offset():
  check(lambda x, y: raw.ConcatOffset(concat_dim=1, shape=[shape_of(x), shape_of(y)]), X, M[:, :2], vmap=False)


def test_split_v_rejects_bad_sizes():
  with pytest.raises(ValueError, match="size_splits"):
    run_rule("SplitV", X, np.asarray([1, 1]), np.int32(1), num_split=2)


def test_static_operand_error_names_op_and_operand():
  fn, params = jaxport.convert(lambda x, s: tf.reshape(x, s), X, np.asarray([4, 6], np.int32))
  assert fn(params, X, np.asarray([4, 6], np.int32))[0].shape == (4, 6)   # eager: concrete
  with pytest.raises(ValueError, match="Reshape node .* needs its `shape`"):
    jax.jit(lambda x, s: fn(params, x, s))(X, np.asarray([4, 6], np.int32))


# --------------------------------------------------------------------------- padding


PADDINGS = [[1, 0], [0, 2], [2, 1]]


@pytest.mark.parametrize("name,fn", [
    ("pad", lambda x: tf.pad(x, PADDINGS)),
    ("pad_v2", lambda x: tf.pad(x, PADDINGS, constant_values=-2.5)),
    ("reflect", lambda x: tf.pad(x, [[1, 1], [2, 0], [0, 3]], mode="REFLECT")),
    ("symmetric", lambda x: tf.pad(x, [[2, 1], [3, 0], [0, 4]], mode="SYMMETRIC")),
    ("Pad", lambda x: raw.Pad(input=x, paddings=PADDINGS)),
    ("PadV2", lambda x: raw.PadV2(input=x, paddings=PADDINGS, constant_values=-2.5)),
])
def test_pad(name, fn):
  check(fn, X)


def test_pad_v2_traced_constant():
  check(lambda x, c: tf.pad(x, PADDINGS, constant_values=c), X, np.float32(3.5), grad=False)


def test_mirror_pad_rejects_too_large_paddings():
  with pytest.raises(ValueError, match="too large"):
    run_rule("MirrorPad", X, np.asarray([[2, 0], [0, 0], [0, 0]]), mode="REFLECT")


def test_pad_scalar_input():
  # Regression (fuzz): a 0-d input has paddings of shape (0, 2); the NumPy path raised.
  x, pads = np.float32(1.5), np.zeros((0, 2), np.int32)
  for op, extra in (("Pad", {}), ("PadV2", {"constant_values": np.float32(4)})):
    expected = getattr(raw, op)(input=x, paddings=pads, **extra).numpy()
    got = run_rule(op, x, pads, *extra.values())
    assert isinstance(got, np.ndarray) and got.shape == () and got == expected
  check(lambda x: raw.PadV2(input=x, paddings=pads, constant_values=4.0), x, grad=False, vmap=False)


def test_reshape_empty_infers_minus_one_like_tf():
  # Regression (fuzz): with a 0 in the target, TF infers -1 from the non-zero sizes
  # ([2, 0, 3] -> [-1, 0] gives [6, 0]); the rule raised.
  x = np.zeros((2, 0, 3), np.float32)
  for target in ([-1, 0], [0, -1], [-1, 0, 5], [3, -1]):
    expected = raw.Reshape(tensor=x, shape=target).numpy()
    assert run_rule("Reshape", x, np.asarray(target, np.int32)).shape == expected.shape
  check(lambda x: raw.Reshape(tensor=x, shape=[-1, 0]), x, grad=False, vmap=False)


# --------------------------------------------------------------------------- selection


def test_where_coordinates_eager_int64():
  with jax.enable_x64(True):
    for cond in (X > 0, (X > 0)[0, 0]):
      check(lambda c: tf.where(c), cond, jit=False, vmap=False)
    check(lambda x: tf.where(x), X.round(), jit=False, vmap=False)   # numeric input: non-zero entries


def test_where_under_jit_raises_clearly():
  fn = jaxport.convert_functional(lambda c: tf.where(c), X > 0)
  with pytest.raises(ValueError, match="Where node .* needs its `input values`"):
    jax.jit(fn)(X > 0)


def select_v1(c, x, y):
  return raw.Select(condition=c, x=x, y=y)


@pytest.mark.parametrize("name,fn,args,vmap", [
    ("select_same_shape", select_v1, (X > 0, X, M), True),
    ("select_rows", select_v1, (np.array([True, False]), X, M), False),   # rows of the unbatched input
    ("select_scalar", select_v1, (np.array(False), X, M), True),
    ("select_v2_broadcast", lambda c, x, y: tf.where(c, x, y[0, :, :1]), (X[0, 0] > 0, X, M), True),
    ("SelectV2", lambda c, x, y: raw.SelectV2(condition=c[:, :1], t=x, e=y[0]), (X > 0, X, M), True),
])
def test_select(name, fn, args, vmap):
  check(fn, *args, vmap=vmap)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
  indices = np.array([[0, 2, -1], [3, 1, 1]], np.int32)   # -1 and 3 are out of range: all off
  check(lambda i: tf.one_hot(i, 3, on_value=2.5, off_value=-1.0, axis=axis), indices)
  check(lambda i: tf.one_hot(i, 4, dtype=tf.int32, axis=axis), indices.astype(np.int64))


def test_one_hot_raw():
  indices = np.array([[0, 2, -1], [3, 1, 1]], np.int32)
  # TF registers no gradient for OneHot (zero w.r.t. on/off values): forward only.
  check(lambda i, on: raw.OneHot(indices=i, depth=3, on_value=on, off_value=-on, axis=1), indices, np.float32(1.5),
        grad=False)


def test_one_hot_traced_on_off_values():
  check(lambda i, on, off: tf.one_hot(i, 3, on_value=on, off_value=off),
        np.array([0, 2, 1], np.int32), np.float32(4.0), np.float32(0.5), grad=False)


def legacy_graph_function(example, build, op, inputs=1, **attrs):
  """A function whose graph holds `op`, an op TF removed from new graphs (GraphDef version too new).

  `build(x)` makes a node named "legacy" with its successor op; the node is retyped to `op`, keeps its
  first `inputs` inputs and gets `attrs` (None deletes one). TF cannot run it; jaxport converts it.
  """
  graph = tf.Graph()
  with graph.as_default():
    x = tf.compat.v1.placeholder(tf.as_dtype(example.dtype), np.shape(example), name="x")
    outputs = build(x)
  graph_def = graph.as_graph_def()
  graph_def.versions.producer = 1
  node = next(n for n in graph_def.node if n.name == "legacy")
  node.op = op
  del node.input[inputs:]
  for key, value in attrs.items():
    if value is None:
      del node.attr[key]
    else:
      node.attr[key].CopyFrom(tf.compat.v1.AttrValue(**value))
  names = [t.name for t in tf.nest.flatten(outputs)]
  imported = lambda x: tf.graph_util.import_graph_def(graph_def, {"x:0": x}, return_elements=names)
  fn = tf.compat.v1.wrap_function(imported, [tf.TensorSpec(np.shape(example), example.dtype)])
  assert op in {n.op for n in fn.graph.as_graph_def().node}
  return fn


@pytest.mark.parametrize("op", ["Unique", "UniqueWithCounts"])
def test_unique_first_occurrence_order(op):
  x = np.array([4, 1, 4, 7, 1, 1, 0], np.int32)
  check(lambda x: getattr(raw, op)(x=x, out_idx=tf.int32), x, jit=False, vmap=False)
  check(lambda x: getattr(raw, op)(x=x, out_idx=tf.int64)[0], x.astype(np.float32),
        jit=False, vmap=False, grad=False)


def test_unique_v2_along_axis():
  x = np.array([[1, 2], [3, 4], [1, 2], [0, 0]], np.int32)
  check(lambda x: raw.UniqueV2(x=x, axis=[0]), x, jit=False, vmap=False)
  check(lambda x: raw.UniqueWithCountsV2(x=x, axis=[1]), x.T.copy(), jit=False, vmap=False)


# --------------------------------------------------------------------------- reordering


@pytest.mark.parametrize("name,fn,args", [
    ("reverse_v2", lambda x: (tf.reverse(x, [0, -1]), tf.reverse(x, [])), (X,)),
    ("reverse_v1", lambda x: raw.Reverse(tensor=x, dims=[False, True, True]), (X,)),
    ("reverse_sequence_seq1", lambda x: tf.reverse_sequence(x, [3, 1], seq_axis=1, batch_axis=0), (X,)),
    ("reverse_sequence_seq2_batch1", lambda x: tf.reverse_sequence(x, [4, 0, 2], seq_axis=2, batch_axis=1), (X,)),
    ("reverse_sequence_traced_lengths",
     lambda x, n: tf.reverse_sequence(x, n, seq_axis=2, batch_axis=0), (X, np.array([2, 4], np.int64))),
    ("roll_scalar", lambda x: tf.roll(x, -2, axis=2), (X,)),
    ("roll_vector_repeated_axis", lambda x: tf.roll(x, [1, 2, 5], axis=[0, 2, 2]), (X,)),
    ("roll_traced_shift", lambda x, s: tf.roll(x, s, axis=[1, 2]), (X, np.array([1, -3], np.int32))),
    ("invert_permutation", lambda p: tf.math.invert_permutation(p), (np.array([3, 0, 4, 1, 2], np.int32),)),
    ("ReverseV2", lambda x: raw.ReverseV2(tensor=x, axis=[0, -1]), (X,)),
    ("ReverseSequence", lambda x: raw.ReverseSequence(input=x, seq_lengths=[4, 0, 2], seq_dim=2, batch_dim=1), (X,)),
    ("Roll", lambda x, s: raw.Roll(input=x, shift=s, axis=[0, 2]), (X, np.array([1, -3], np.int32))),
    ("InvertPermutation", lambda p: raw.InvertPermutation(x=p), (np.array([3, 0, 4, 1, 2], np.int64),)),
])
def test_reordering(name, fn, args):
  check(fn, *args)


# --------------------------------------------------------------------------- sequences


@pytest.mark.parametrize("start,limit,delta,dtype", [
    (0, 7, 2, tf.int32), (5, -4, -3, tf.int32), (3, 3, 1, tf.int32),
    (0.1, 1.7, 0.3, tf.float32), (2.0, -1.0, -0.7, tf.float32), (0.1, 2.3, 0.1, tf.float64),
])
def test_range(start, limit, delta, dtype):
  with jax.enable_x64(dtype == tf.float64):
    check(lambda: tf.range(start, limit, delta, dtype=dtype), vmap=False, atol=0, rtol=0)


def test_range_from_shape():
  check(lambda x: tf.range(shape_of(x)[-1]), X)
  with jax.enable_x64(True):
    check(lambda x: tf.range(tf.constant(1, tf.int64), raw.Size(input=x, out_type=tf.int64), 5), X)


def test_range_rejects_unreachable_limit():
  with pytest.raises(ValueError, match="cannot reach"):
    run_rule("Range", np.int32(0), np.int32(5), np.int32(-1), Tidx=np.int32)


@pytest.mark.parametrize("num", [1, 2, 7])
def test_lin_space(num):
  check(lambda: raw.LinSpace(start=tf.constant(-1.3), stop=tf.constant(2.9), num=num), vmap=False, atol=0, rtol=0)
  check(lambda a, b: raw.LinSpace(start=a, stop=b, num=num), np.float32(0.5), np.float32(-3.0), grad=False)


# --------------------------------------------------------------------------- bands and diagonals


@pytest.mark.parametrize("lower,upper", [(0, -1), (1, 0), (-1, -1), (0, 0), (2, 1)])
def test_matrix_band_part(lower, upper):
  check(lambda x: tf.linalg.band_part(x, lower, upper), X)


def test_matrix_band_part_traced_bounds():
  check(lambda x, lo, hi: tf.linalg.band_part(x, lo, hi), X, np.int64(1), np.int64(-1))


ALIGNS = ["RIGHT_LEFT", "LEFT_RIGHT", "LEFT_LEFT", "RIGHT_RIGHT"]
D3 = rs.normal(size=(2, 3, 4)).astype(np.float32)   # [batch, num_diags, max_len]


@pytest.mark.parametrize("align", ALIGNS)
def test_matrix_diag_v3_band(align):
  check(lambda d: tf.linalg.diag(d, k=(-1, 1), align=align, padding_value=9.0), D3)
  check(lambda d: tf.linalg.diag(d, k=(1, 3), num_rows=4, align=align), D3)
  check(lambda x: tf.linalg.diag_part(x, k=(-1, 2), align=align, padding_value=5.0), X)
  check(lambda x: tf.linalg.diag_part(x, k=(-2, -1), align=align), X)
  check(lambda x, d: tf.linalg.set_diag(x, d[:, :2, :3], k=(0, 1), align=align), X, D3)


def test_band_and_diagonal_ops_raw():
  check(lambda x: raw.MatrixBandPart(input=x, num_lower=1, num_upper=0), X)
  check(lambda d: raw.MatrixDiagV3(diagonal=d, k=[-1, 1], num_rows=-1, num_cols=-1, padding_value=9.0,
                                   align="RIGHT_LEFT"), D3)
  check(lambda x: raw.MatrixDiagPartV3(input=x, k=[-1, 2], padding_value=5.0, align="LEFT_RIGHT"), X)
  check(lambda x, d: raw.MatrixSetDiagV3(input=x, diagonal=d[:, :2, :3], k=[0, 1], align="RIGHT_RIGHT"), X, D3)


def test_matrix_diag_single_diagonal():
  check(lambda v: (tf.linalg.diag(v), tf.linalg.diag(v, k=-2), tf.linalg.diag(v, k=1, num_rows=5, num_cols=7)), V)
  check(lambda x: (tf.linalg.diag_part(x), tf.linalg.diag_part(x, k=2), tf.linalg.set_diag(x, x[:, 0, :3])), X)


def test_matrix_diag_v1_v2():
  check(lambda v, x: (raw.MatrixDiag(diagonal=v), raw.MatrixDiagPart(input=x),
                      raw.MatrixSetDiag(input=x, diagonal=x[:, :, 0])), V, X)
  # TF's gradients of the v2 band ops unpack with the v3 default alignment, not v2's LEFT_LEFT (a TF bug).
  check(lambda d, x: (raw.MatrixDiagV2(diagonal=d, k=[-1, 1], num_rows=-1, num_cols=-1, padding_value=0.0),
                      raw.MatrixDiagPartV2(input=x, k=[0, 1], padding_value=1.0),
                      raw.MatrixSetDiagV2(input=x, diagonal=d[:, :2, :3], k=[-1, 0])), D3, X, grad=False)


def test_matrix_diag_matches_tf_on_int():
  x = np.arange(12, dtype=np.int32).reshape(3, 4)
  fn = jaxport.convert_functional(lambda x: tf.linalg.diag_part(x, k=(-1, 1)), x)
  assert_close(fn(x), tf.linalg.diag_part(x, k=(-1, 1)), 0, 0)


def test_boolean_mask_eager_with_gradient():
  """Where's data-dependent shape works without jit, also under jax.grad (the mask is concrete there)."""
  check(lambda x: tf.boolean_mask(x, x[..., 0] > 0), X, jit=False, vmap=False)


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16, tf.int8, tf.uint8, tf.bool])
def test_dtypes_are_preserved(dtype):
  x = (X > 0) if dtype == tf.bool else X.astype(dtype.as_numpy_dtype)

  def plumbing(x):
    return (tf.concat([x, x[::-1]], 0), tf.pad(x, [[1, 0], [0, 1], [0, 0]]), tf.gather(x, [1, 0], axis=2),
            tf.transpose(x), tf.tile(x, [1, 2, 1]), tf.stack([x, x[:, ::-1]]), tf.reverse(x, [1]),
            tf.where(x[0, 0] == x[0, 1], x, x[1]), tf.reshape(x, [-1]), tf.one_hot([0, 2], 3, x[0, 0, 0], x[0, 0, 1]))

  check(plumbing, x, grad=False, vmap=False)


@pytest.mark.parametrize("block,pads", [([2, 2], [[0, 0], [0, 0]]), ([2, 3], [[1, 1], [2, 1]]), ([2], [[1, 3]])])
def test_space_to_batch_and_back(block, pads):
  x = np.random.RandomState(0).normal(size=(2, 6, 6, 3)).astype(np.float32)
  to_batch = lambda t: tf.raw_ops.SpaceToBatchND(input=t, block_shape=block, paddings=pads)
  check(to_batch, x)
  check(lambda t: tf.raw_ops.BatchToSpaceND(input=to_batch(t) * 2.0, block_shape=block, crops=pads), x)


def test_dilated_conv_uses_space_to_batch():
  x = np.random.RandomState(0).normal(size=(1, 9, 9, 2)).astype(np.float32)
  w = np.random.RandomState(1).normal(size=(3, 3, 2, 4)).astype(np.float32)
  check(lambda t, k: tf.nn.atrous_conv2d(t, k, rate=2, padding="SAME"), x, w, atol=1e-4, rtol=1e-4)


def test_range_from_a_traced_start_has_a_static_length():
  """`tf.range(start, start + n)` with `start` an input (MoViNet's streaming positional encoding from a
  frame count): its length n is static, so it runs under jit."""
  @tf.function
  def fn(start, x):
    positions = tf.range(start, start + tf.shape(x)[1], 2)
    return tf.cast(positions, tf.float32)[None, :] * x[:, ::2]
  start, x = np.int32(7), np.random.RandomState(0).normal(size=(2, 5)).astype(np.float32)
  jax_fn, params = jaxport.convert(fn, start, x)
  for s in (np.int32(7), np.int32(-3)):
    assert_close(jax.jit(jax_fn)(params, s, x)[0], fn(s, x).numpy(), atol=1e-6, rtol=1e-6)


def test_unravel_index():
  # UnravelIndex: 1-D and 0-D indices, constant and traced dims; TF refuses indices out of range
  check(lambda i: tf.unravel_index(i, [3, 4, 5]), np.array([0, 7, 59, 23], np.int32))
  check(lambda i: tf.unravel_index(i, [3, 4, 5]), np.array(17, np.int64), vmap=False)
  check(lambda i, d: tf.unravel_index(i, d), np.array([0, 7, 11], np.int32), np.array([3, 4], np.int32))
  jax_fn, params = jaxport.convert(tf.function(lambda i: tf.unravel_index(i, [2, 3])), np.array([1, 2], np.int32))
  with pytest.raises(jaxport.errors.InvalidNodeError, match="UnravelIndex"):
    jax_fn(params, np.array([1, 6], np.int32))
