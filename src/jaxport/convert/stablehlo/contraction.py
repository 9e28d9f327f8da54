"""StableHLO contractions and solvers: dot, dot_general, einsum, convolution, fft, cholesky,
triangular_solve.

The result element type becomes `preferred_element_type` (bf16 inputs accumulating in
f32 stay so), `precision_config` becomes `lax.Precision` and a `dot_algorithm` becomes
the matching `lax.DotAlgorithmPreset` (or a `lax.DotAlgorithm`; XLA:CPU runs only the
presets). A convolution's `window_reversal` flips the kernel's spatial dims before
`lax.conv_general_dilated`, which has no such flag. Float results match XLA to float
tolerance, not bit for bit: the summation order is XLA's choice each time it compiles.
"""
from __future__ import annotations

import functools
import re

import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxport.convert.ops import conv_lowering
from jaxport.convert.stablehlo.elementwise import canon, jax_dtype
from jaxport.convert.stablehlo.interpreter import handler
from jaxport.errors import StableHLOError

_PRECISIONS = {"DEFAULT": lax.Precision.DEFAULT, "HIGH": lax.Precision.HIGH, "HIGHEST": lax.Precision.HIGHEST}


def _precision(ctx):
  """The lax `precision` for the op's `algorithm` or `precision_config`, or None."""
  algorithm = ctx.attrs.get("algorithm")
  if algorithm:
    return _algorithm(ctx, algorithm)
  config = ctx.attrs.get("precision_config")
  if not config:
    return None
  values = []
  for p in config:
    name = getattr(p, "value", p)
    if name not in _PRECISIONS:
      raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: unknown precision {name!r}")
    values.append(_PRECISIONS[name])
  return tuple(values) if len(values) == 2 else values[0]


_TYPE_NAMES = {"f16": "F16", "bf16": "BF16", "f32": "F32", "f64": "F64", "tf32": "TF32"}
_DTYPES = {"f16": jnp.float16, "bf16": jnp.bfloat16, "f32": jnp.float32, "f64": jnp.float64}


def _algorithm(ctx, text):
  """A `#stablehlo.dot_algorithm<...>` attribute as a lax preset (or `lax.DotAlgorithm`)."""
  fields = dict(re.findall(r"(\w+)\s*=\s*(\w+)", str(text)))
  try:
    lhs, rhs, acc = fields["lhs_precision_type"], fields["rhs_precision_type"], fields["accumulation_type"]
    counts = (int(fields.get("lhs_component_count", 1)), int(fields.get("rhs_component_count", 1)))
    ops = int(fields.get("num_primitive_operations", 1))
    imprecise = fields.get("allow_imprecise_accumulation", "false") == "true"
  except (KeyError, ValueError):
    raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: cannot read its algorithm {text}") from None
  if all(t in _TYPE_NAMES for t in (lhs, rhs, acc)) and counts == (1, 1) and not imprecise:
    name = "_".join(_TYPE_NAMES[t] for t in (lhs, rhs, acc)) + ("" if ops == 1 else f"_X{ops}")
    if name in lax.DotAlgorithmPreset.__members__:
      return lax.DotAlgorithmPreset[name]
  if not all(t in _DTYPES for t in (lhs, rhs, acc)):
    raise StableHLOError(f"{ctx.op.name} in module {ctx.call.name!r}: dot algorithm {text} is not supported")
  return lax.DotAlgorithm(_DTYPES[lhs], _DTYPES[rhs], _DTYPES[acc], counts[0], counts[1], ops, imprecise)


def _preferred(ctx, *operands):
  """The result type as `preferred_element_type`, when it differs from the operands'."""
  out = jax_dtype(ctx.result_type)
  return None if all(jnp.asarray(x).dtype == out for x in operands) else out


@handler("stablehlo.dot_general")
def dot_general(ctx, lhs, rhs):
  dn = ctx.attr("dot_dimension_numbers")
  dims = ((tuple(dn["lhs_contracting_dimensions"]), tuple(dn["rhs_contracting_dimensions"])),
          (tuple(dn["lhs_batching_dimensions"]), tuple(dn["rhs_batching_dimensions"])))
  lhs, rhs = canon(lhs), canon(rhs)
  return lax.dot_general(lhs, rhs, dims, precision=_precision(ctx), preferred_element_type=_preferred(ctx, lhs, rhs))


@handler("stablehlo.dot")
def dot(ctx, lhs, rhs):
  lhs, rhs = canon(lhs), canon(rhs)
  return lax.dot(lhs, rhs, precision=_precision(ctx), preferred_element_type=_preferred(ctx, lhs, rhs))


@handler("stablehlo.einsum")
def einsum(ctx, lhs, rhs):
  lhs, rhs = canon(lhs), canon(rhs)
  return jnp.einsum(ctx.attr("einsum_config"), lhs, rhs, precision=_precision(ctx),
                    preferred_element_type=_preferred(ctx, lhs, rhs))


@handler("stablehlo.unary_einsum")
def unary_einsum(ctx, x):
  return jnp.einsum(ctx.attr("einsum_config"), canon(x))


# --------------------------------------------------------------------------- convolution

@handler("stablehlo.convolution")
def convolution(ctx, lhs, rhs):
  dn = ctx.attr("dimension_numbers")
  spatial = len(dn["input_spatial_dimensions"])
  ones = (1,) * spatial
  padding = ctx.attrs.get("padding")
  padding = [(0, 0)] * spatial if padding is None else [(int(lo), int(hi)) for lo, hi in np.reshape(padding, (-1, 2))]
  lhs, rhs = canon(lhs), canon(rhs)
  reversal = ctx.attrs.get("window_reversal")
  if reversal is not None and any(reversal):
    rhs = lax.rev(rhs, tuple(d for d, r in zip(dn["kernel_spatial_dimensions"], reversal) if r))
  dnums = lax.ConvDimensionNumbers(
      lhs_spec=(dn["input_batch_dimension"], dn["input_feature_dimension"], *dn["input_spatial_dimensions"]),
      rhs_spec=(dn["kernel_output_feature_dimension"], dn["kernel_input_feature_dimension"],
                *dn["kernel_spatial_dimensions"]),
      out_spec=(dn["output_batch_dimension"], dn["output_feature_dimension"], *dn["output_spatial_dimensions"]))
  strides = tuple(ctx.attrs.get("window_strides") or ones)
  lhs_dilation = tuple(ctx.attrs.get("lhs_dilation") or ones)
  rhs_dilation = tuple(ctx.attrs.get("rhs_dilation") or ones)
  groups = int(ctx.attrs.get("feature_group_count", 1))
  batch_groups = int(ctx.attrs.get("batch_group_count", 1))
  preferred = _preferred(ctx, lhs, rhs)
  conv = functools.partial(
      lax.conv_general_dilated, window_strides=strides, padding=padding, lhs_dilation=lhs_dilation,
      rhs_dilation=rhs_dilation, dimension_numbers=dnums, feature_group_count=groups,
      batch_group_count=batch_groups, precision=_precision(ctx), preferred_element_type=preferred)
  if (spatial == 2 and groups == 1 and batch_groups == 1 and lhs_dilation == ones and preferred is None
      and jnp.issubdtype(lhs.dtype, jnp.floating) and lhs.dtype == rhs.dtype
      and conv_lowering.tap_filter_grad_pays([rhs.shape[d] for d in dn["kernel_spatial_dimensions"]])):
    # A forward 2-D conv (as converted TF convs export): its filter gradient by one GEMM per tap on
    # CPU, as the converter's own rule differentiates it.
    return conv_lowering.conv_general_tapped(lhs, rhs, window_strides=strides, padding=padding,
                                             rhs_dilation=rhs_dilation, dimension_numbers=dnums, conv=conv)
  return conv(lhs, rhs)


# --------------------------------------------------------------------------- fft and solvers

@handler("stablehlo.fft")
def fft(ctx, x):
  kind = getattr(ctx.attr("fft_type"), "value", ctx.attr("fft_type"))
  if kind not in lax.FftType.__members__:
    raise StableHLOError(f"stablehlo.fft in module {ctx.call.name!r}: unknown fft_type {kind!r}")
  return lax.fft(canon(x), lax.FftType[kind], tuple(int(n) for n in ctx.attr("fft_length")))


@handler("stablehlo.cholesky")
def cholesky(ctx, a):
  """Reads only the `lower` (or upper) triangle of `a`, as StableHLO does."""
  a = canon(a)
  if ctx.attrs.get("lower", False):
    return lax.linalg.cholesky(a, symmetrize_input=False)
  l = lax.linalg.cholesky(jnp.conj(jnp.swapaxes(a, -1, -2)), symmetrize_input=False)
  return jnp.conj(jnp.swapaxes(l, -1, -2))


@handler("stablehlo.triangular_solve")
def triangular_solve(ctx, a, b):
  transpose = getattr(ctx.attr("transpose_a"), "value", ctx.attr("transpose_a"))
  if transpose not in ("NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"):
    raise StableHLOError(f"stablehlo.triangular_solve in module {ctx.call.name!r}: unknown transpose_a "
                         f"{transpose!r}")
  return lax.linalg.triangular_solve(
      canon(a), canon(b), left_side=bool(ctx.attr("left_side")), lower=bool(ctx.attr("lower")),
      transpose_a=transpose != "NO_TRANSPOSE", conjugate_a=transpose == "ADJOINT",
      unit_diagonal=bool(ctx.attr("unit_diagonal")))
