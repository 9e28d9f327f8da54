"""Case builders of the structured fuzz families (gathers and scatters, sparse and ragged tensors, former
host callbacks, nn, image, matmul, spectral and linear algebra, special functions): `test_fuzz_ops.py`
runs them."""
from __future__ import annotations

import numpy as np

import fuzz_engine as fz
from fuzz_engine import FLOATS, Case, fill, random_data, random_shape, sample


# --------------------------------------------------------------------------- gather / scatter


def gather_case(rs):
  op = sample(rs, ["GatherV2", "GatherNd", "ScatterNd", "TensorScatterUpdate", "TensorScatterAdd",
                   "TensorScatterSub", "UnsortedSegmentSum", "UnsortedSegmentMax", "SegmentSum",
                   "Bincount_skip"])
  shape = sample(rs, [(3,), (2, 3), (1, 4, 1), (2, 0, 3), (4,)])
  idx_dtype = sample(rs, [np.int32, np.int64])
  dtype = sample(rs, FLOATS + ("int32", "int64"))
  if op == "GatherV2":
    axis = rs.randint(-len(shape), len(shape))
    batch_dims = 0
    ind = rs.randint(0, shape[axis], size=sample(rs, [(), (2,), (2, 2), (0,)])) if shape[axis] else np.zeros((0,))
    return Case(op, [random_data(rs, shape, dtype), ind.astype(idx_dtype), np.array(axis, np.int32)],
                {"batch_dims": batch_dims}, static=frozenset({2})), 1
  if op == "GatherNd" or op.startswith("TensorScatter") or op == "ScatterNd":
    depth = rs.randint(1, len(shape) + 1)
    n = sample(rs, [(), (2,), (3,), (0,)])
    if any(d == 0 for d in shape[:depth]) and int(np.prod(n)) > 0:
      n = (0,)
    ind = np.stack([rs.randint(0, max(d, 1), size=n) for d in shape[:depth]], -1).astype(idx_dtype)
    if op == "GatherNd":
      return Case(op, [random_data(rs, shape, dtype), ind]), 1
    upd_shape = tuple(n) + shape[depth:]
    updates = fill(rs, dtype, upd_shape, rs.rand() < 0.3)
    if op == "TensorScatterUpdate" and ind.size:   # duplicate indices: TF picks an unspecified one
      _, first = np.unique(ind.reshape(-1, depth), axis=0, return_index=True)
      ind = ind.reshape(-1, depth)[np.sort(first)]
      updates = updates.reshape((-1,) + shape[depth:])[np.sort(first)]
    if op == "ScatterNd":
      return Case(op, [ind, updates, np.array(shape, idx_dtype)], static=frozenset({2})), 1
    return Case(op, [random_data(rs, shape, dtype), ind, updates]), 1
  if op == "Bincount_skip":
    op = "UnsortedSegmentMin"
  n = shape[0]
  num = rs.randint(1, 4)
  seg = np.sort(rs.randint(0, num, size=n)).astype(idx_dtype)
  if op == "SegmentSum":
    return Case(op, [random_data(rs, shape, dtype), seg], jit=False), 4
  if rs.rand() < 0.3:
    seg = np.where(rs.rand(n) < 0.3, -1, seg).astype(idx_dtype)   # dropped entries
  return Case(op, [random_data(rs, shape, dtype), seg, np.array(num, np.int32)], static=frozenset({2})), 4


# --------------------------------------------------------------------------- sparse


SPARSE_OPS = ["SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN", "SparseSegmentSumWithNumSegments",
              "SparseSegmentMeanWithNumSegments", "SparseTensorDenseMatMul", "SparseReduceSum", "SparseReduceMax",
              "SparseSoftmax", "SparseDenseCwiseMul", "SparseDenseCwiseAdd", "SparseReorder", "SparseReshape",
              "SparseFillEmptyRows", "SparseAdd"]


def _coords(rs, shape, most: int, shuffle=False):
  """Up to `most` distinct coordinates in `shape`, row-major sorted (or shuffled), as [n, rank] int64."""
  size = int(np.prod(shape))
  flat = np.sort(rs.choice(size, min(most, size), replace=False)) if size else np.zeros(0, np.int64)
  if shuffle:
    flat = rs.permutation(flat)
  return np.stack(np.unravel_index(flat, shape), -1).astype(np.int64).reshape(len(flat), len(shape))


def sparse_case(rs):
  op = sample(rs, SPARSE_OPS)
  edges = rs.rand() < 0.3
  if op.startswith("SparseSegment"):
    ints = ("int32", "int64") if op.startswith("SparseSegmentSum") else ()
    dtype = sample(rs, fz.dtypes_for(op, FLOATS + ints))
    rows, k = rs.randint(1, 5), rs.randint(0, 6)
    data = fill(rs, dtype, (rows,) + sample(rs, [(), (2,), (0,), (2, 1)]), edges)
    indices = rs.randint(0, rows, k).astype(sample(rs, [np.int32, np.int64]))
    ids = np.sort(rs.randint(0, 4, k)).astype(sample(rs, [np.int32, np.int64]))
    if op.endswith("WithNumSegments"):   # the ids may be traced: the output has num_segments rows
      segments = np.array((ids.max() + 1 if k else 0) + rs.randint(0, 2), np.int32)
      return Case(op, [data, indices, ids, segments], static=frozenset({3})), 4
    return Case(op, [data, indices, ids], static=frozenset({2})), 4
  shape = sample(rs, [(4,), (3, 4), (2, 3, 2), (1, 5), (3, 0)])
  coords = _coords(rs, shape, rs.randint(0, 7), shuffle=op == "SparseReorder")
  dims = np.array(shape, np.int64)
  if op == "SparseTensorDenseMatMul":
    shape = sample(rs, [(3, 4), (1, 5), (2, 2)])
    coords = _coords(rs, shape, rs.randint(0, 7), shuffle=True)
    dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "int32", "complex64")))
    adjoint_a, adjoint_b = bool(rs.rand() < 0.5), bool(rs.rand() < 0.5)
    inner, cols = shape[0] if adjoint_a else shape[1], rs.randint(1, 4)
    b = fill(rs, dtype, (cols, inner) if adjoint_b else (inner, cols), edges)
    values = fill(rs, dtype, (len(coords),), edges)
    return Case(op, [coords, values, np.array(shape, np.int64), b], {"adjoint_a": adjoint_a, "adjoint_b": adjoint_b},
                static=frozenset({2})), 8
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "float16", "int32")))
  values = fill(rs, dtype, (len(coords),), edges)
  if op in ("SparseReduceSum", "SparseReduceMax"):
    axes = np.array([a for a in range(len(shape)) if rs.rand() < 0.5] or [rs.randint(-len(shape), len(shape))],
                    np.int32)
    return Case(op, [coords, values, dims, axes], {"keep_dims": bool(rs.rand() < 0.5)},
                static=frozenset({2, 3})), 8
  if op == "SparseSoftmax":
    dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "float16")))
    return Case(op, [coords, fill(rs, dtype, (len(coords),), edges), dims], static=frozenset({2})), 16
  if op in ("SparseDenseCwiseMul", "SparseDenseCwiseAdd"):
    dense_shape = tuple(1 if rs.rand() < 0.3 else d for d in shape[rs.randint(0, len(shape) + 1):])
    return Case(op, [coords, values, dims, fill(rs, dtype, dense_shape, edges)], static=frozenset({2})), 1
  if op == "SparseReorder":
    return Case(op, [coords, values, dims]), 1
  if op == "SparseReshape":
    size = int(np.prod(shape))
    target = sample(rs, [[size], [-1], [1, -1], [-1, 2] if size % 2 == 0 else [size, 1], list(shape)[::-1]])
    return Case(op, [coords, dims, np.array(target, np.int64)], static=frozenset({1, 2})), 1
  if op == "SparseFillEmptyRows":
    return Case(op, [coords, values, dims, fill(rs, dtype, (), edges)], static=frozenset({0, 2})), 1
  other = _coords(rs, shape, rs.randint(0, 7))
  return Case(op, [coords, values, dims, other, fill(rs, dtype, (len(other),), edges), dims,
                   np.zeros((), np.float32 if dtype.startswith("float") else dtype)],
              static=frozenset({0, 2, 3, 5, 6})), 1


# --------------------------------------------------------------------------- ragged


def _splits(rs, rows: int, most: int) -> np.ndarray:
  return np.concatenate([[0], np.cumsum(rs.randint(0, most + 1, rows))]).astype(sample(rs, [np.int32, np.int64]))


def ragged_case(rs):
  op = sample(rs, ["RaggedTensorToTensor", "RaggedGather", "RaggedRange"])
  dtype = sample(rs, ("float32", "float64", "int32", "float16"))
  if op == "RaggedRange":
    kind = sample(rs, [np.int32, np.int64, np.float32])
    starts, limits = rs.randint(-4, 5, 3).astype(kind), rs.randint(-4, 9, 3).astype(kind)
    deltas = np.where(rs.rand(3) < 0.3, -1, 1) * rs.randint(1, 4, 3).astype(kind)
    if kind == np.float32:
      deltas = deltas * np.float32(sample(rs, [0.5, 0.7, 1.3]))
    return Case(op, [starts, limits, deltas.astype(kind)], {"Tsplits": sample(rs, [np.int32, np.int64])},
                static=frozenset({0, 1, 2})), 4
  outer = _splits(rs, rs.randint(1, 4), 3)
  levels = [outer] + ([_splits(rs, int(outer[-1]), 2).astype(outer.dtype)] if rs.rand() < 0.4 else [])
  inner = sample(rs, [(), (2,)])
  values = fill(rs, dtype, (int(levels[-1][-1]),) + inner, rs.rand() < 0.3)
  if op == "RaggedGather":
    indices = rs.randint(0, len(outer) - 1, size=sample(rs, [(3,), (2, 2), (0,)])).astype(np.int32)
    return Case(op, levels + [values, indices], {"OUTPUT_RAGGED_RANK": len(levels) + indices.ndim - 1},
                layout=(("params_nested_splits", len(levels)), ("params_dense_values", None), ("indices", None)),
                static=frozenset(range(len(levels))) | {len(levels) + 1}), 1
  rank = 1 + len(levels) + len(inner)
  shape = np.array([sample(rs, [-1, -1, 1, 2, 4]) for _ in range(rank)], np.int64)
  shape[1 + len(levels):] = np.where(shape[1 + len(levels):] == -1, -1, inner) if inner else shape[1 + len(levels):]
  default = fill(rs, dtype, sample(rs, [(), inner]), False)
  # a width left to the data (-1) is the longest row: then the splits must be known
  known_splits = range(3, 3 + len(levels)) if (shape[1:1 + len(levels)] == -1).any() else ()
  return Case(op, [shape, values, default] + levels, {"row_partition_types": ["ROW_SPLITS"] * len(levels)},
              layout=(("shape", None), ("values", None), ("default_value", None),
                      ("row_partition_tensors", len(levels))), static=frozenset({0, *known_splits})), 1


def former_callbacks_case(rs):
  """Ops that were host callbacks until the families above were written: order statistics, index
  arithmetic, sparse structure, argmax pooling and dilation, TF's fused RNN cells."""
  op = sample(rs, ["NthElement", "UnravelIndex", "SparseSlice", "SparseConcat", "SparseSplit",
                   "SparseSparseMaximum", "SparseSparseMinimum", "RaggedTensorToSparse",
                   "MaxPoolWithArgmax", "Dilation2D", "LSTMBlockCell", "GRUBlockCell"])
  if op in ("MaxPoolWithArgmax", "Dilation2D"):
    return _window_case(rs, op)
  if op in ("LSTMBlockCell", "GRUBlockCell"):
    return _rnn_cell_case(rs, op)
  if op == "NthElement":   # NaN has no order in TF's nth_element: finite and infinite values only
    dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "int32", "float16", "int64")))
    x = fill(rs, dtype, sample(rs, [(1,), (5,), (2, 4), (2, 1, 3)]), False, pool=[-1, 0, 2, 2, 3, -np.inf, np.inf]
             if rs.rand() < 0.3 and dtype.startswith("float") else None)
    n = np.int32(rs.randint(0, x.shape[-1]))
    return Case(op, [x, n], {"reverse": bool(rs.rand() < 0.5)}, static=frozenset({1})), 1
  if op == "UnravelIndex":
    kind = sample(rs, [np.int32, np.int64])
    dims = np.array([rs.randint(1, 5) for _ in range(rs.randint(1, 4))], kind)
    indices = rs.randint(0, int(np.prod(dims)), size=sample(rs, [(), (4,), (0,)])).astype(kind)
    return Case(op, [indices, dims], vary=(0,)), 1
  dtype = sample(rs, ("float32", "float64", "int32", "float16"))
  edges = rs.rand() < 0.3
  if op == "RaggedTensorToSparse":
    outer = _splits(rs, rs.randint(1, 4), 3)
    levels = [outer] + ([_splits(rs, int(outer[-1]), 2).astype(outer.dtype)] if rs.rand() < 0.4 else [])
    values = fill(rs, dtype, (int(levels[-1][-1]),) + sample(rs, [(), (2,), (1, 2)]), edges)
    return Case(op, levels + [values], layout=(("rt_nested_splits", len(levels)), ("rt_dense_values", None)),
                static=frozenset(range(len(levels))) if rs.rand() < 0.5 else frozenset()), 1
  shape = sample(rs, [(4,), (3, 4), (2, 3, 2), (1, 5), (3, 0)])
  dims = np.array(shape, np.int64)
  coords = _coords(rs, shape, rs.randint(0, 7), shuffle=op != "SparseSparseMaximum" and rs.rand() < 0.3)
  values = fill(rs, dtype, (len(coords),), edges)
  if op == "SparseSlice":
    start = np.array([rs.randint(-1, d + 1) for d in shape], np.int64)
    size = np.array([rs.randint(0, d + 2) for d in shape], np.int64)
    return Case(op, [coords, values, dims, start, size], static=frozenset({0, 2, 3, 4})), 1
  if op == "SparseSplit":
    axis = rs.randint(-len(shape), len(shape))
    if shape[axis] == 0:
      axis, shape = 0, (3,) + shape[1:]
      dims = np.array(shape, np.int64)
      coords = _coords(rs, shape, rs.randint(0, 7))
      values = fill(rs, dtype, (len(coords),), edges)
    return Case(op, [np.int64(axis), coords, values, dims], {"num_split": int(rs.randint(1, shape[axis] + 1))},
                static=frozenset({0, 1, 3})), 1
  if op == "SparseConcat":
    count, axis = rs.randint(1, 4), rs.randint(-len(shape), len(shape))
    shapes = [tuple(rs.randint(0, 3) if k == axis % len(shape) else d for k, d in enumerate(shape))
              for _ in range(count)]
    parts = [_coords(rs, s, rs.randint(0, 4), shuffle=rs.rand() < 0.3) for s in shapes]
    vals = [fill(rs, dtype, (len(c),), edges) for c in parts]
    return Case(op, parts + vals + [np.array(s, np.int64) for s in shapes], {"concat_dim": int(axis)},
                layout=(("indices", count), ("values", count), ("shapes", count)),
                static=frozenset(range(count)) | frozenset(range(2 * count, 3 * count))), 1
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "int32", "float16")))
  values = fill(rs, dtype, (len(coords),), edges)
  other = _coords(rs, shape, rs.randint(0, 7))
  return Case(op, [coords, values, dims, other, fill(rs, dtype, (len(other),), edges), dims],
              static=frozenset({0, 2, 3, 5})), 1


def _window_case(rs, op):
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "float16", "int32")))
  n, h, w, c = rs.randint(1, 3), rs.randint(1, 6), rs.randint(1, 6), rs.randint(1, 3)
  x = fill(rs, dtype, (n, h, w, c), rs.rand() < 0.3)
  kh, kw = rs.randint(1, 4), rs.randint(1, 4)
  strides = [1, int(rs.randint(1, 3)), int(rs.randint(1, 3)), 1]
  padding = sample(rs, ["SAME", "VALID"])
  if op == "MaxPoolWithArgmax":
    if padding == "VALID":
      kh, kw = min(kh, h), min(kw, w)
    return Case(op, [x], {"ksize": [1, int(kh), int(kw), 1], "strides": strides, "padding": padding,
                          "Targmax": np.dtype(np.int64), "include_batch_in_index": bool(rs.rand() < 0.5)}), 1
  rates = [1, int(rs.randint(1, 3)), int(rs.randint(1, 3)), 1]
  if padding == "VALID":
    kh, kw = min(kh, (h - 1) // rates[1] + 1), min(kw, (w - 1) // rates[2] + 1)
  return Case(op, [x, fill(rs, dtype, (kh, kw, c), rs.rand() < 0.3)],
              {"strides": strides, "rates": rates, "padding": padding}), 4


def _rnn_cell_case(rs, op):
  batch, inputs, cell = rs.randint(1, 4), rs.randint(1, 4), rs.randint(1, 4)
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float16")))
  draw = lambda *shape: fill(rs, dtype, shape, False) * np.asarray(0.5, dtype)   # noqa: E731
  x, h_prev = draw(batch, inputs), draw(batch, cell)
  if op == "GRUBlockCell":
    return Case(op, [x, h_prev, draw(inputs + cell, 2 * cell), draw(inputs + cell, cell), draw(2 * cell),
                     draw(cell)]), 64
  peephole = bool(rs.rand() < 0.5)
  return Case(op, [x, draw(batch, cell), h_prev, draw(inputs + cell, 4 * cell), draw(cell), draw(cell), draw(cell),
                   draw(4 * cell)],
              {"forget_bias": float(sample(rs, [0.0, 1.0, 0.5])), "cell_clip": float(sample(rs, [-1.0, 0.0, 0.7, 3.0])),
               "use_peephole": peephole}), 64


# --------------------------------------------------------------------------- nn


def nn_case(rs):
  op = sample(rs, ["Softmax", "LogSoftmax", "BiasAdd", "Conv2D", "MaxPool", "AvgPool", "L2Loss",
                   "DepthwiseConv2dNative", "Relu6", "Selu", "Elu"])
  dtype = sample(rs, ("float32", "float16", "bfloat16", "float64"))
  edges = rs.rand() < 0.3
  if op in ("Softmax", "LogSoftmax"):
    return Case(op, [fill(rs, dtype, sample(rs, [(3,), (2, 3), (1, 4, 1), (2, 0, 3), (0, 2)]), edges)]), 16
  if op in ("Relu6", "Selu", "Elu", "L2Loss"):
    return Case(op, [fill(rs, dtype, random_shape(rs), edges)]), 16
  if op == "BiasAdd":
    shape = sample(rs, [(2, 3), (1, 4, 1), (2, 0, 3), (2, 3, 2, 2)])
    fmt = sample(rs, ["NHWC", "NCHW"]) if len(shape) >= 3 else "NHWC"
    c = shape[1] if fmt == "NCHW" else shape[-1]
    return Case(op, [fill(rs, dtype, shape, edges), fill(rs, dtype, (c,), edges)],
                {"data_format": fmt}), 1
  dtype = sample(rs, ("float32", "float64", "float16", "bfloat16"))
  n, h, w, c = rs.randint(1, 3), rs.randint(1, 6), rs.randint(1, 6), rs.randint(1, 3)
  x = fill(rs, dtype, (n, h, w, c), False)
  strides = [1, int(rs.randint(1, 3)), int(rs.randint(1, 3)), 1]
  padding = sample(rs, ["SAME", "VALID"])
  kh, kw = rs.randint(1, 3), rs.randint(1, 3)
  if padding == "VALID":
    kh, kw = min(kh, h), min(kw, w)
  if op in ("MaxPool", "AvgPool"):
    x = fill(rs, dtype, (n, h, w, c), edges)
    return Case(op, [x], {"ksize": [1, int(kh), int(kw), 1], "strides": strides, "padding": padding,
                          "data_format": "NHWC"}), 64
  dil = [1, int(rs.randint(1, 3)), int(rs.randint(1, 3)), 1] if strides == [1, 1, 1, 1] else [1, 1, 1, 1]
  if op == "Conv2D":
    f = fill(rs, dtype, (kh, kw, c, rs.randint(1, 3)), False)
    return Case(op, [x, f], {"strides": strides, "padding": padding, "dilations": dil,
                             "data_format": "NHWC"}), 256
  f = fill(rs, dtype, (kh, kw, c, rs.randint(1, 3)), False)
  return Case(op, [x, f], {"strides": strides, "padding": padding, "dilations": dil,
                           "data_format": "NHWC"}), 256


# --------------------------------------------------------------------------- image, matmul, fft


def image_case(rs):
  op = sample(rs, ["ResizeBilinear", "ResizeNearestNeighbor", "ResizeBicubic", "ResizeArea",
                   "RGBToHSV", "HSVToRGB", "AdjustContrastv2", "AdjustSaturation", "AdjustHue"])
  dtype = sample(rs, ("float32", "float16", "float64", "uint8", "int32"))
  if op in ("RGBToHSV", "HSVToRGB"):
    x = fill(rs, sample(rs, ("float32", "float64")), sample(rs, [(3,), (2, 3), (1, 2, 3), (0, 3)]),
             False, pool=np.linspace(0, 1, 9))
    return Case(op, [x], vary=()), 64
  if op.startswith("Adjust"):
    x = fill(rs, "float32", sample(rs, [(2, 2, 3), (1, 3, 2, 3), (0, 2, 3)]), False,
             pool=np.linspace(0, 1, 9))
    factor = np.array(sample(rs, [0.0, 0.5, 1.3, -0.2]), np.float32)
    return Case(op, [x, factor], vary=()), 256
  x = fill(rs, dtype, (rs.randint(1, 3), rs.randint(1, 5), rs.randint(1, 5), rs.randint(1, 3)),
           False)
  size = np.array([rs.randint(1, 7), rs.randint(1, 7)], np.int32)
  attrs = {"align_corners": bool(rs.rand() < 0.3)}
  if op != "ResizeArea":
    attrs["half_pixel_centers"] = bool(not attrs["align_corners"] and rs.rand() < 0.6)
  return Case(op, [x, size], attrs, static=frozenset({1})), 256


def matmul_case(rs):
  op = sample(rs, ["MatMul", "BatchMatMulV2", "Einsum_skip"])
  dtype = sample(rs, ("float32", "float64", "float16", "bfloat16", "int32", "complex64"))
  m, k, n = rs.randint(0, 4), rs.randint(0, 4), rs.randint(0, 4)
  edges = rs.rand() < 0.2
  if op == "MatMul":
    ta, tb = bool(rs.rand() < 0.5), bool(rs.rand() < 0.5)
    a = fill(rs, dtype, (k, m) if ta else (m, k), edges)
    b = fill(rs, dtype, (n, k) if tb else (k, n), edges)
    return Case(op, [a, b], {"transpose_a": ta, "transpose_b": tb}), 64
  batch = sample(rs, [(), (2,), (1,), (2, 1)])
  adj_x, adj_y = bool(rs.rand() < 0.5), bool(rs.rand() < 0.5)
  a = fill(rs, dtype, batch + ((k, m) if adj_x else (m, k)), edges)
  b = fill(rs, dtype, batch[-1:] + ((n, k) if adj_y else (k, n)), edges)
  return Case("BatchMatMulV2", [a, b], {"adj_x": adj_x, "adj_y": adj_y}), 64


def spectral_case(rs):
  op = sample(rs, ["FFT", "IFFT", "RFFT", "IRFFT", "FFT2D", "RFFT2D", "LowerBound", "UpperBound",
                   "Bucketize", "MatrixInverse", "MatrixDeterminant", "Cholesky", "DiagPart",
                   "MatrixBandPart", "InvertPermutation", "Unique", "DepthToSpace", "SpaceToDepth"])
  if op in ("FFT", "IFFT", "FFT2D"):
    x = fill(rs, "complex64", sample(rs, [(4,), (2, 3), (1, 4), (3, 2, 2)]), False)
    return Case(op, [x]), 256
  if op in ("RFFT", "RFFT2D"):
    rank = 1 if op == "RFFT" else 2
    x = fill(rs, "float32", sample(rs, [(4,), (2, 3), (1, 4), (3, 2, 2)]), False)
    length = np.array([rs.randint(1, 6) for _ in range(rank)], np.int32)
    if len(x.shape) < rank:
      x = x.reshape((1,) + x.shape)
    return Case(op, [x, length], static=frozenset({1})), 256
  if op == "IRFFT":
    x = fill(rs, "complex64", sample(rs, [(3,), (2, 3), (1, 4)]), False)
    return Case(op, [x, np.array([rs.randint(1, 7)], np.int32)], static=frozenset({1})), 256
  if op in ("LowerBound", "UpperBound"):
    dtype = sample(rs, ("float32", "int32", "int64", "float64"))
    sorted_in = np.sort(fill(rs, dtype, (2, rs.randint(0, 5)), False), axis=-1)
    values = fill(rs, dtype, (2, rs.randint(0, 4)), False)
    return Case(op, [sorted_in, values], vary=(1,), attrs={"out_type": sample(rs, [np.dtype(np.int32), np.dtype(np.int64)])}), 1
  if op == "Bucketize":
    dtype = sample(rs, ("float32", "int32", "int64", "float64"))
    bounds = sorted(float(v) for v in rs.choice([-3.0, -1.0, 0.0, 0.5, 2.0, 7.0], size=rs.randint(0, 4), replace=False))
    return Case(op, [fill(rs, dtype, random_shape(rs), rs.rand() < 0.3)], {"boundaries": bounds}), 1
  if op in ("MatrixInverse", "MatrixDeterminant", "Cholesky"):
    dtype = sample(rs, ("float32", "float64"))
    n = rs.randint(0, 4)
    a = rs.normal(size=(2, n, n))
    a = a @ np.swapaxes(a, -1, -2) + n * np.eye(n)   # well conditioned, positive definite
    return Case(op, [a.astype(dtype)], vary=()), 4096
  if op == "DiagPart":
    n = rs.randint(0, 4)
    return Case(op, [random_data(rs, (n, n))]), 1
  if op == "MatrixBandPart":
    x = random_data(rs, sample(rs, [(2, 3), (3, 3), (2, 0, 3), (1, 4, 1)]))
    lo, hi = sample(rs, [-1, 0, 1, 2]), sample(rs, [-1, 0, 1, 2])
    t = sample(rs, [np.int32, np.int64])
    return Case(op, [x, np.array(lo, t), np.array(hi, t)]), 1
  if op == "InvertPermutation":
    return Case(op, [rs.permutation(rs.randint(0, 6)).astype(sample(rs, [np.int32, np.int64]))]), 1
  if op == "Unique":
    x = fill(rs, sample(rs, ("int32", "int64", "float32")), (rs.randint(0, 7),), False,
             pool=[0, 1, 2, -1, 5])
    return Case(op, [x], {"out_idx": sample(rs, [np.dtype(np.int32), np.dtype(np.int64)])}, jit=False), 1
  block = int(rs.randint(1, 3))
  if op == "DepthToSpace":
    x = random_data(rs, (1, rs.randint(1, 3), rs.randint(1, 3), block * block * rs.randint(1, 3)))
  else:
    x = random_data(rs, (1, block * rs.randint(1, 3), block * rs.randint(1, 3), rs.randint(1, 3)))
  return Case(op, [x], {"block_size": block, "data_format": "NHWC"}), 1


def special_functions_case(rs):
  """Bessel functions (Eigen's float and double algorithms) over the whole float range; banded
  triangular solves and matrix square roots of well-conditioned matrices."""
  op = sample(rs, ["BesselJ0", "BesselJ1", "BesselY0", "BesselY1", "BesselK0", "BesselK0e", "BesselK1",
                   "BesselK1e", "BandedTriangularSolve", "MatrixSquareRoot"])
  if op in ("BandedTriangularSolve", "MatrixSquareRoot"):
    return _well_conditioned_case(rs, op)
  dtype = sample(rs, fz.dtypes_for(op, FLOATS))
  pool = [0.0, 1e-6, 0.3, 0.89, 1.5, 2.0, 2.4048, 3.8317, 5.0, 7.5, 30.0, 1e4, -0.7, -4.0]
  x = fill(rs, dtype, random_shape(rs), rs.rand() < 0.3, pool=None if rs.rand() < 0.5 else pool)
  return Case(op, [x]), 256


def _well_conditioned_case(rs, op):
  dtype = sample(rs, fz.dtypes_for(op, ("float32", "float64", "complex64")))
  batch, n = sample(rs, [(), (2,), (1, 3)]), int(rs.randint(1, 6))
  if op == "MatrixSquareRoot":   # eigenvalues near n: a principal root, far from the negative axis
    x = rs.uniform(-0.5, 0.5, batch + (n, n)) + n * np.eye(n)
    if dtype.startswith("complex"):
      x = x + 0.3j * rs.uniform(-1, 1, x.shape)
    return Case(op, [x.astype(dtype)]), 64
  bands = int(rs.randint(1, n + 2))
  lower = bool(rs.rand() < 0.5)
  matrix = rs.uniform(-1, 1, batch + (bands, n))
  matrix[..., 0 if lower else bands - 1, :] += np.where(rs.rand(n) < 0.5, 4, -4)   # the diagonal
  rhs = rs.uniform(-2, 2, sample(rs, [batch, ()]) + (n, int(rs.randint(1, 4))))
  return Case(op, [matrix.astype(dtype), rhs.astype(dtype)],
              {"lower": lower, "adjoint": bool(rs.rand() < 0.5)}), 16
