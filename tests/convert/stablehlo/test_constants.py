"""No constant over `max_constant_bytes` is materialized by the StableHLO interpreter: splat constants stay
one value, and results of constant operands over the limit are computed by XLA, not folded."""
import jax
import keras
import numpy as np
import pytest

import jaxport
from jaxport import config
from jaxport.convert import stablehlo

LIMIT = config.max_constant_bytes()


def _largest_constant(closed_jaxpr) -> int:
  return max([np.asarray(c).nbytes for c in closed_jaxpr.consts], default=0)


def test_splat_constants_stay_one_value():
  x = np.ones((64, 197, 768), np.float32)   # 38 MB activations: exact GELU's 27 coefficients are splats of it
  f = lambda x: jax.nn.gelu(x, approximate=False)
  module = stablehlo.load_module(jax.export.export(jax.jit(f))(x).mlir_module_serialized)
  run = lambda x: stablehlo.call_module(module, [x])[0]
  assert _largest_constant(jax.make_jaxpr(run)(x)) <= 64
  np.testing.assert_allclose(jax.jit(run)(x * 0.5), f(x * 0.5), rtol=1e-6)


MODULE = """
func.func @main(%arg0: tensor<1024x1024xf32>) -> tensor<1024x1024xf32> {
  %c0 = stablehlo.constant dense<1.5> : tensor<1024x1024xf32>
  %c1 = stablehlo.constant dense<2.0> : tensor<1024x1024xf32>
  %0 = stablehlo.add %c0, %c1 : tensor<1024x1024xf32>
  %1 = stablehlo.multiply %arg0, %0 : tensor<1024x1024xf32>
  return %1 : tensor<1024x1024xf32>
}"""


def test_results_of_constants_over_the_limit_are_not_folded():
  module = stablehlo.load_module(MODULE)
  run = lambda x: stablehlo.call_module(module, [x])[0]
  x = np.arange(1024 * 1024, dtype=np.float32).reshape(1024, 1024)
  assert _largest_constant(jax.make_jaxpr(run)(x)) <= LIMIT
  np.testing.assert_array_equal(jax.jit(run)(x), x * 3.5)
  with config.override_config("max_constant_bytes", 1 << 30):   # the limit is what keeps it an op
    fresh = lambda x: stablehlo.call_module(module, [x])[0]   # not `run`: its trace is cached
    assert _largest_constant(jax.make_jaxpr(fresh)(x)) == 4 * 1024 * 1024


def test_a_jitted_loaded_artifact_captures_no_constant_over_the_limit(tmp_path):
  keras.utils.set_random_seed(0)
  model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1024, activation="gelu"), keras.layers.Dense(4)])
  x = np.random.RandomState(0).normal(size=(300, 16)).astype(np.float32)   # 1.2 MB GELU activations
  jax_fn, params = jaxport.convert(model, x)
  jaxport.export(jax_fn, params, path=tmp_path / "mlp", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "mlp")
  closed = jax.make_jaxpr(jax.jit(loaded.outputs_only))(loaded_params, x)
  inner = closed.eqns[0].params["jaxpr"]   # the jit's own computation
  assert _largest_constant(inner) <= LIMIT and _largest_constant(closed) <= LIMIT
  np.testing.assert_allclose(jax.jit(loaded.outputs_only)(loaded_params, x), model(x).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_a_jitted_loaded_keras_hub_vit_captures_no_constant_over_the_limit(tmp_path):
  keras_hub = pytest.importorskip("keras_hub")
  if keras.backend.backend() != "tensorflow":
    pytest.skip("converts a TF graph: needs KERAS_BACKEND=tensorflow")
  keras.utils.set_random_seed(0)
  model = keras_hub.models.ViTBackbone(image_shape=(32, 32, 3), patch_size=8, num_layers=2, num_heads=2,
                                       hidden_dim=32, mlp_dim=64)
  images = np.random.RandomState(0).uniform(-1, 1, (320, 32, 32, 3)).astype(np.float32)   # 1.4 MB MLP activations
  jax_fn, params = jaxport.convert(model, images)
  jaxport.export(jax_fn, params, path=tmp_path / "vit", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "vit")
  closed = jax.make_jaxpr(jax.jit(loaded.outputs_only))(loaded_params, images)
  assert _largest_constant(closed.eqns[0].params["jaxpr"]) <= LIMIT
  out = jax.jit(loaded.outputs_only)(loaded_params, images[:320])
  np.testing.assert_allclose(out, model(images, training=False).numpy(), rtol=1e-4, atol=1e-4)
