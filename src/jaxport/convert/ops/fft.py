"""Op rules: the FFT family (FFT/IFFT, their 2D/3D forms, and the real RFFT/IRFFT).

Each op transforms the innermost 1, 2 or 3 axes with jax.numpy.fft. IFFT* scale by
1/n, as TF does. The real ops take `fft_length` (a trace-time constant): each
transformed axis is cropped or zero-padded to `fft_length`, except the innermost
axis of an IRFFT* input, which is cropped or padded to `fft_length[-1] // 2 + 1`.

Known differences from TF: TF's CPU kernels refuse inputs shorter than `fft_length`
(the `tf.signal` wrappers pad before calling them); here such inputs are zero-padded,
as in TF's XLA lowering. With JAX's x64 mode off, complex128/float64 results are
complex64/float32.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxport.convert.ops._util import static_ints
from jaxport.convert.registry import register
from jaxport.errors import InvalidNodeError


def _axes(rank: int) -> tuple[int, ...]:
  return tuple(range(-rank, 0))


def _as(x, dtype):
  dtype = jax.dtypes.canonicalize_dtype(dtype)
  return x if x.dtype == dtype else x.astype(dtype)


def _fft_lengths(ctx, fft_length, rank: int) -> list[int]:
  lengths = static_ints(fft_length, f"{ctx.op} node {ctx.name!r}: fft_length")
  if len(lengths) != rank:
    raise InvalidNodeError(f"{ctx.op} node {ctx.name!r}: fft_length has {len(lengths)} entries, expected {rank}")
  return lengths


def _complex(ctx, inverse: bool, rank: int, x):
  x = jnp.asarray(x)
  dtype = ctx.attr("Tcomplex", x.dtype)
  transform = jnp.fft.ifftn if inverse else jnp.fft.fftn
  return _as(transform(_as(x, dtype), axes=_axes(rank)), dtype)


def _real(ctx, rank: int, x, fft_length):
  x = jnp.asarray(x)
  lengths = _fft_lengths(ctx, fft_length, rank)
  real_dtype = ctx.attr("Treal", x.dtype)
  out = jnp.fft.rfftn(_as(x, real_dtype), s=lengths, axes=_axes(rank))
  return _as(out, ctx.attr("Tcomplex", np.result_type(real_dtype, np.complex64)))


def _inverse_real(ctx, rank: int, x, fft_length):
  x = jnp.asarray(x)
  lengths = _fft_lengths(ctx, fft_length, rank)
  complex_dtype = ctx.attr("Tcomplex", x.dtype)
  out = jnp.fft.irfftn(_as(x, complex_dtype), s=lengths, axes=_axes(rank))
  return _as(out, ctx.attr("Treal", np.finfo(complex_dtype).dtype))


@register("FFT")
def fft(ctx, x):
  return _complex(ctx, False, 1, x)


@register("FFT2D")
def fft2d(ctx, x):
  return _complex(ctx, False, 2, x)


@register("FFT3D")
def fft3d(ctx, x):
  return _complex(ctx, False, 3, x)


@register("IFFT")
def ifft(ctx, x):
  return _complex(ctx, True, 1, x)


@register("IFFT2D")
def ifft2d(ctx, x):
  return _complex(ctx, True, 2, x)


@register("IFFT3D")
def ifft3d(ctx, x):
  return _complex(ctx, True, 3, x)


@register("RFFT")
def rfft(ctx, x, fft_length):
  return _real(ctx, 1, x, fft_length)


@register("RFFT2D")
def rfft2d(ctx, x, fft_length):
  return _real(ctx, 2, x, fft_length)


@register("RFFT3D")
def rfft3d(ctx, x, fft_length):
  return _real(ctx, 3, x, fft_length)


@register("IRFFT")
def irfft(ctx, x, fft_length):
  return _inverse_real(ctx, 1, x, fft_length)


@register("IRFFT2D")
def irfft2d(ctx, x, fft_length):
  return _inverse_real(ctx, 2, x, fft_length)


@register("IRFFT3D")
def irfft3d(ctx, x, fft_length):
  return _inverse_real(ctx, 3, x, fft_length)
