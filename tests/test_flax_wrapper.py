"""jaxport.flax.ConvertedModule: a converted Keras backbone as a Flax NNX module."""
import importlib
import subprocess
import sys

import jax
import keras
import numpy as np
import pytest

nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")

import jaxport  # noqa: E402
from jaxport.flax import ConvertedModule  # noqa: E402


@pytest.fixture(scope="module")
def backbone():
  """A Keras CNN converted in training mode (BN statistics, dropout) and in inference mode."""
  keras.utils.set_random_seed(0)
  layers = keras.layers
  model = keras.Sequential([keras.Input((8, 8, 3)), layers.Conv2D(4, 3, padding="same", name="conv"),
                            layers.BatchNormalization(name="bn"), layers.ReLU(),
                            layers.GlobalAveragePooling2D(), layers.Dropout(0.25)], name="backbone")
  x = np.zeros((16, 8, 8, 3), np.float32)
  train_fn, params = jaxport.convert(lambda t: model(t, training=True), x)
  eval_fn, _ = jaxport.convert(model, x)
  return train_fn, eval_fn, params


def _data(n=16, seed=0):
  """Class c brightens channel c of a noisy image."""
  rs = np.random.RandomState(seed)
  labels = rs.randint(0, 3, size=n).astype(np.int32)
  images = rs.normal(size=(n, 8, 8, 3)).astype(np.float32)
  images[np.arange(n), :, :, labels] += 1.0
  return images, labels


class Classifier(nnx.Module):
  def __init__(self, backbone, *, rngs: nnx.Rngs):
    train_fn, eval_fn, params = backbone
    self.backbone = ConvertedModule(train_fn, params, eval_fn=eval_fn, rngs=rngs)
    self.head = nnx.Linear(4, 3, rngs=rngs)

  def __call__(self, x):
    return self.head(self.backbone(x))


def test_variables_keep_jaxport_keys(backbone):
  train_fn, _, params = backbone
  module = ConvertedModule(train_fn, params, rngs=nnx.Rngs(0))
  assert set(module.variables) == set(params)
  for key, variable in module.variables.items():
    assert type(variable) is (nnx.Param if train_fn.trainable[key] else nnx.BatchStat), key
  assert "backbone/conv/kernel" in module.variables
  param_paths = {path for path, _ in nnx.to_flat_state(nnx.state(module, nnx.Param))}
  assert param_paths == {("variables", k) for k in params if train_fn.trainable[k]}
  stat_paths = {path for path, _ in nnx.to_flat_state(nnx.state(module, nnx.BatchStat))}
  assert ("variables", "backbone/bn/moving_mean") in stat_paths
  for key, value in module.to_params().items():
    np.testing.assert_array_equal(value, params[key])


def test_outputs_and_batch_stats_equal_jax_fn(backbone):
  train_fn, eval_fn, params = backbone
  x, _ = _data()
  module = ConvertedModule(train_fn, params, eval_fn=eval_fn, rngs=nnx.Rngs(dropout=0))
  key = jax.random.key(3)
  expected, new_params = train_fn(params, x, rng=key)
  np.testing.assert_allclose(module(x, rng=key), expected, atol=1e-6, rtol=0)
  for name, value in module.to_params().items():   # new_params written back
    np.testing.assert_allclose(value, new_params[name], atol=1e-6, rtol=0, err_msg=name)
  assert not np.allclose(module.variables["backbone/bn/moving_mean"].get_value(), params["backbone/bn/moving_mean"])

  # Without rng=, keys come from the module's stream: each call draws a fresh one, under nnx.jit too.
  step = nnx.jit(lambda m, x: m(x))
  assert not np.allclose(step(module, x), step(module, x))

  module.eval()   # NNX's eval mode picks the inference conversion: no rng, statistics stay
  before = module.to_params()
  expected, _ = eval_fn({k: before[k] for k in eval_fn.param_keys}, x)
  np.testing.assert_allclose(step(module, x), expected, atol=1e-6, rtol=0)
  for name, value in module.to_params().items():
    np.testing.assert_array_equal(value, before[name], err_msg=name)
  module.train()
  assert not module.deterministic


def test_random_ops_need_rngs_or_rng(backbone):
  train_fn, _, params = backbone
  x, _ = _data()
  # Keras 3's dropout is stateless (a function of its seed state); a stateful TF op needs a key.
  import tensorflow as tf
  noisy_fn, noisy_params = jaxport.convert(lambda t: t + tf.random.uniform(tf.shape(t)), x)
  module = ConvertedModule(noisy_fn, noisy_params)
  with pytest.raises(jaxport.MissingInputError, match=r"rngs=nnx\.Rngs"):
    module(x)
  module(x, rng=jax.random.key(0))
  with pytest.raises(jaxport.MissingInputError, match="backbone/conv/kernel"):
    ConvertedModule(train_fn, {k: v for k, v in params.items() if k != "backbone/conv/kernel"})


def test_backbone_and_flax_head_train_with_nnx_optimizer(backbone):
  train_fn, _, params = backbone
  x, y = _data()
  model = Classifier(backbone, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer, x, y):
    def loss_fn(model):
      return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss

  losses = [float(train_step(model, optimizer, x, y)) for _ in range(40)]
  assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses

  tuned = model.backbone.to_params()
  for key in params:   # weights moved through the optimizer, BN statistics and seed state through new_params
    assert not np.array_equal(tuned[key], params[key]), key
  trainable = [k for k in params if train_fn.trainable[k]]
  assert len(jax.tree.leaves(nnx.state(model, nnx.Param))) == len(trainable) + 2   # + the head's kernel, bias


def test_missing_flax_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "flax", None)
  monkeypatch.delitem(sys.modules, "jaxport.flax")
  with pytest.raises(ImportError, match=r"pip install 'jaxport\[flax\]'"):
    importlib.import_module("jaxport.flax")


def test_import_jaxport_leaves_flax_alone():
  code = "import sys, jaxport; assert 'flax' not in sys.modules and 'jaxport.flax' not in sys.modules"
  subprocess.run([sys.executable, "-c", code], check=True)
