"""Global conversion settings, with the same keys and semantics as tf2jax's."""
import contextlib
from typing import Any, Iterator

_DEFAULTS: dict[str, Any] = {
    "strict_shape_check": True,
    "strict_dtype_check": False,
    "force_const_float32_to_bfloat16": False,
    "force_const_float64_to_bfloat16": False,
    "convert_custom_gradient": True,
    "raise_on_prevent_gradient": True,
    "infer_relu_from_jax2tf": True,
    "infer_cumulative_reduction_from_jax2tf": True,
    "xlacallmodule_strict_checks": True,
    "enable_checkify_for_asserts": False,
    # Conversion tiers (see jaxport.convert.tiers).
    "allow_xla_lowering": True,
    "allow_host_callback": True,
    "force_tier": None,
}
_config: dict[str, Any] = dict(_DEFAULTS)


def _check_key(key: str) -> None:
  if key not in _config:
    raise ValueError(f"Unknown jaxport config key {key!r}; valid keys: {', '.join(sorted(_config))}.")


def get_config(key: str) -> Any:
  _check_key(key)
  return _config[key]


def update_config(key: str, value: Any) -> None:
  _check_key(key)
  _config[key] = value


@contextlib.contextmanager
def override_config(key: str, value: Any) -> Iterator[None]:
  """Sets `key` to `value` inside the `with` block, restoring it afterwards."""
  old = get_config(key)
  update_config(key, value)
  try:
    yield
  finally:
    update_config(key, old)


def snapshot() -> dict[str, Any]:
  """The current settings; conversions capture this so later changes do not leak in."""
  return dict(_config)
