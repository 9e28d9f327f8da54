"""Global conversion settings: tf2jax's 13 keys with its semantics, and jaxport's own.

Each key has a type; `update_config` refuses a value of another type (`"no"` for a
boolean key would be truthy), naming the key and the values it takes.
"""
import contextlib
from typing import Any, Iterator

import jax
import numpy as np

from jaxport.errors import ConfigError

PRECISIONS = ("default", "high", "highest", "bfloat16", "tensorfloat32", "float32")
TIERS = (None, "native", "stablehlo", "callback")

# key: (default, allowed type or tuple of allowed values, what it does)
_SCHEMA: dict[str, tuple[Any, Any, str]] = {
    "strict_shape_check": (True, bool, "input shapes must match the traced ones (read at call time)"),
    "strict_dtype_check": (False, bool, "input and param dtypes must match; off: they are cast, with a warning"),
    "force_const_float32_to_bfloat16": (False, bool, "float32 constants become bfloat16"),
    "force_const_float64_to_bfloat16": (False, bool, "float64 constants become bfloat16"),
    "convert_custom_gradient": (True, bool, "tf.custom_gradient functions keep their gradient"),
    "raise_on_prevent_gradient": (True, bool, "differentiating PreventGradient raises"),
    "infer_relu_from_jax2tf": (True, bool, "max(x, 0) from jax2tf exports becomes relu (its gradient at 0)"),
    "infer_cumulative_reduction_from_jax2tf": (True, bool, "reduce_window cumsums from jax2tf become cumsum"),
    "resize_bilinear_precision": ("highest", PRECISIONS, "matmul precision of bilinear resizes"),
    "enable_checkify_for_asserts": (False, bool, "Assert, CheckNumerics, gather bounds and integer "
                                    "division by zero become jax.experimental.checkify checks"),
    "xlacallmodule_strict_checks": (True, bool, "XlaCallModule refuses platforms it was not lowered for"),
    "disable_assert_in_tensor_list_get_item": (False, bool, "skip TensorListGetItem's element dtype check"),
    "defer_softmax_normalization": (True, bool, "a Softmax consumed by a product over its axis (attention) "
                                    "is divided by its row sums after the product, on CPU (other backends keep the plain form)"),
    "skip_variables_evaluation_inside_tf_tracing": (
        False, bool, "params are zeros of their variables' shapes, not read from TF (always read as zeros inside a TF trace)"),
    "eager_jit": (True, bool, "a converted function called outside any JAX transformation runs its graph as one "
                  "jax.jit, compiled once per input shapes (op by op, each op compiles apart), and where that cannot "
                  "trace (shapes that depend on values) in segments: runs of nodes that trace jitted, the rest op by "
                  "op; read at call time"),
    "tf_random_streams": (False, bool, "stateful random ops TF seeded (tf.random.set_seed or an op seed) draw TF's "
                          "own numbers: each node's Philox counter is a param (random_stream/<node>), advanced per "
                          "call as in TF; off: they draw from rng"),
    # Conversion tiers (see jaxport.convert.tiers).
    "allow_xla_lowering": (True, bool, "ops without a native rule may use TF's XLA lowering"),
    "allow_host_callback": (True, bool, "ops no other tier takes may call TF on the host"),
    "force_tier": (None, TIERS, "route every op that tier can take through it"),
    # Constant folding (the converter and the StableHLO interpreter).
    "max_constant_bytes": (1 << 20, int, "the largest array (in bytes) folded into a constant at conversion; "
                           "larger results of constant inputs (shape-only masks) stay ops in the traced function"),
}
_DEFAULTS: dict[str, Any] = {key: spec[0] for key, spec in _SCHEMA.items()}
_config: dict[str, Any] = dict(_DEFAULTS)


def _check_key(key: str) -> None:
  if key not in _config:
    raise ConfigError(f"Unknown jaxport config key {key!r}; valid keys: {', '.join(sorted(_config))}.")


def _check_value(key: str, value: Any) -> Any:
  _, allowed, _ = _SCHEMA[key]
  if allowed is bool:
    if isinstance(value, bool):
      return value
    raise ConfigError(f"config key {key!r} takes True or False, got {value!r} ({type(value).__name__})")
  if allowed is int:   # a bool is an int to Python, not a size
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 0:
      return int(value)
    raise ConfigError(f"config key {key!r} takes a non-negative int, got {value!r} ({type(value).__name__})")
  if isinstance(value, jax.lax.Precision):   # resize_bilinear_precision: as tf2jax, a Precision too
    value = value.name.lower()
  if value not in allowed:
    raise ConfigError(f"config key {key!r} takes one of {', '.join(map(repr, allowed))}; got {value!r}")
  return value


def get_config(key: str) -> Any:
  _check_key(key)
  return _config[key]


def max_constant_bytes() -> int:
  """The `max_constant_bytes` limit: no constant over it is folded at conversion."""
  return _config["max_constant_bytes"]


def update_config(key: str, value: Any) -> None:
  _check_key(key)
  _config[key] = _check_value(key, value)


@contextlib.contextmanager
def override_config(key: str, value: Any) -> Iterator[None]:
  """Sets `key` to `value` inside the `with` block, restoring it afterwards."""
  old = get_config(key)
  update_config(key, value)
  try:
    yield
  finally:
    _config[key] = old


@contextlib.contextmanager
def override_configs(values: dict[str, Any]) -> Iterator[None]:
  """`override_config` for several keys at once."""
  with contextlib.ExitStack() as stack:
    for key, value in values.items():
      stack.enter_context(override_config(key, value))
    yield


def describe() -> dict[str, tuple[Any, str]]:
  """Every key with its default and what it does."""
  return {key: (spec[0], spec[2]) for key, spec in _SCHEMA.items()}


def snapshot() -> dict[str, Any]:
  """The current settings; conversions capture this so later changes do not leak in."""
  return dict(_config)
