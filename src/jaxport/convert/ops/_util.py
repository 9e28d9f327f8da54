"""Helpers shared by op rules."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
  """A trace-time constant: NumPy data that stays NumPy through shape arithmetic."""
  return isinstance(x, (np.ndarray, np.generic, int, float, bool))


def xp(*arrays):
  """NumPy when every input is a trace-time constant, else jax.numpy.

  Rules that compute with `xp(...)` keep constant shape arithmetic in NumPy, so
  reshapes and slices stay static under jit.
  """
  return np if all(is_concrete(a) for a in arrays) else jnp


def static_value(x, what: str = "value"):
  """The NumPy value of an input that must be known at trace time."""
  if not is_concrete(x):
    raise ValueError(f"{what} must be a trace-time constant, but it depends on the function's inputs")
  return np.asarray(x)


def static_ints(x, what: str = "value") -> list[int]:
  return [int(v) for v in np.asarray(static_value(x, what)).reshape(-1)]


def cast(x, dtype):
  """`x.astype(dtype)`, keeping constants as NumPy."""
  if is_concrete(x):
    return np.asarray(x).astype(dtype)
  return x.astype(dtype)


def as_array(x):
  """NumPy stays NumPy; everything else goes through jnp.asarray."""
  return np.asarray(x) if is_concrete(x) else jnp.asarray(x)
