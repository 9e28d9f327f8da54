"""The FFT family against TF: FFT/IFFT (1D-3D) and RFFT/IRFFT with fft_length."""
import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import tensorflow as tf

import jaxport
from oracle import check

RAW = tf.raw_ops


def normal(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).normal(size=shape).astype(dtype)


def parts(z):
  """A complex result as (real, imag): the oracle differentiates float outputs only."""
  return tf.math.real(z), tf.math.imag(z)


def test_complex_ffts_1d_2d_3d():
  def fn(re, im):
    z = tf.complex(re, im)
    return [parts(RAW.FFT(input=z)), parts(RAW.IFFT(input=z)),
            parts(RAW.FFT2D(input=z)), parts(RAW.IFFT2D(input=z)),
            parts(RAW.FFT3D(input=z)), parts(RAW.IFFT3D(input=z))]
  check(fn, normal(2, 3, 4, 5), normal(2, 3, 4, 5, seed=1), atol=1e-4, rtol=1e-4)


def test_complex_fft_outputs_complex():
  z = (normal(3, 8) + 1j * normal(3, 8, seed=1)).astype(np.complex64)
  check(lambda z: (RAW.FFT(input=z), RAW.IFFT2D(input=z)), z, atol=1e-4, rtol=1e-4)


def test_real_ffts():
  x = normal(2, 3, 4, 6)
  check(lambda x: [parts(RAW.RFFT(input=x, fft_length=[6])), parts(RAW.RFFT2D(input=x, fft_length=[4, 6]))],
        x, atol=1e-4, rtol=1e-4)
  # TF defines no gradient for RFFT3D, and its gradient of a cropping RFFT fails to build.
  # Longer fft_lengths (padding) are refused by TF's CPU kernels: tested below against NumPy.
  def no_grad(x):
    return [RAW.RFFT3D(input=x, fft_length=[3, 4, 6]), RAW.RFFT(input=x, fft_length=[5]),
            RAW.RFFT2D(input=x, fft_length=[3, 5]), RAW.RFFT3D(input=x, fft_length=[2, 3, 4])]
  check(no_grad, x, atol=1e-4, rtol=1e-4, grad=False)


def test_inverse_real_ffts():
  # The innermost input axis holds fft_length // 2 + 1 terms: 4 for lengths 6 and 7.
  re, im = normal(2, 3, 4, 4), normal(2, 3, 4, 4, seed=1)
  check(lambda re, im: [RAW.IRFFT(input=tf.complex(re, im), fft_length=[6]),
                        RAW.IRFFT2D(input=tf.complex(re, im), fft_length=[4, 7])],
        re, im, atol=1e-4, rtol=1e-4)
  # No TF gradient for IRFFT3D, nor for a cropping IRFFT.
  def no_grad(re, im):
    z = tf.complex(re, im)
    return [RAW.IRFFT3D(input=z, fft_length=[3, 4, 6]), RAW.IRFFT(input=z, fft_length=[4]),
            RAW.IRFFT2D(input=z, fft_length=[3, 5]), RAW.IRFFT3D(input=z, fft_length=[2, 3, 4])]
  check(no_grad, re, im, atol=1e-4, rtol=1e-4, grad=False)


@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(rank=st.integers(1, 3), data=st.data())
def test_real_fft_lengths_crop_like_tf(rank, data):
  # Any fft_length TF's CPU kernels accept: at most the input's length (for IRFFT's inner axis, n // 2 + 1).
  shape = data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank), "shape")
  lengths = [data.draw(st.integers(1, d), "fft_length") for d in shape[:-1]]
  lengths.append(data.draw(st.integers(1, 2 * shape[-1] - 1), "fft_length[-1]"))
  x = normal(2, *shape)
  z = (x + 1j * normal(2, *shape, seed=1)).astype(np.complex64)
  suffix = {1: "", 2: "2D", 3: "3D"}[rank]
  forward, inverse = getattr(RAW, "RFFT" + suffix), getattr(RAW, "IRFFT" + suffix)
  fn = lambda x, z: (forward(input=x, fft_length=[min(n, d) for n, d in zip(lengths, shape)]),  # noqa: E731
                     inverse(input=z, fft_length=lengths))
  jax_fn, params = jaxport.convert(fn, x, z)
  for got, want in zip(jax_fn(params, x, z)[0], fn(x, z)):
    np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=1e-4)


def test_real_ffts_pad_short_inputs_like_numpy():
  # TF's CPU kernels refuse these; its XLA lowering (and NumPy) zero-pad.
  x, z = normal(2, 3), (normal(2, 3) + 1j * normal(2, 3, seed=1)).astype(np.complex64)
  fn = lambda x, z: (RAW.RFFT2D(input=x, fft_length=[4, 5]), RAW.IRFFT2D(input=z, fft_length=[3, 8]))  # noqa: E731
  jax_fn, params = jaxport.convert(fn, x, z)
  rfft, irfft = jax.jit(lambda x, z: jax_fn(params, x, z)[0])(x, z)
  np.testing.assert_allclose(rfft, np.fft.rfft2(x, s=[4, 5]), atol=1e-5)
  np.testing.assert_allclose(irfft, np.fft.irfft2(z, s=[3, 8]), atol=1e-5)


def test_double_precision_attrs():
  x = normal(3, 6, dtype=np.float64)
  z = (x + 1j * normal(3, 6, seed=1, dtype=np.float64)).astype(np.complex128)
  def fn(x, z):
    return (RAW.RFFT(input=x, fft_length=[6], Tcomplex=tf.complex128),
            RAW.IRFFT(input=z, fft_length=[10], Treal=tf.float64),
            RAW.FFT2D(input=z), RAW.IFFT(input=z))
  with jax.enable_x64(True):
    check(fn, x, z, atol=1e-10, rtol=1e-10, grad=False)
