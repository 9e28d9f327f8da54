"""Call forms of a converted function: `f` (all params), `f.with_changed_params`, `f.outputs_only`."""
import jax
import jax.numpy as jnp
import keras
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.errors import UnsupportedValueError
from oracle import assert_close, check

X = np.random.RandomState(0).normal(size=(4, 6)).astype(np.float32)


@pytest.fixture(scope="module")
def bn_model():
  keras.utils.set_random_seed(0)
  return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.BatchNormalization(momentum=0.5),
                           keras.layers.Dense(3)])


@pytest.fixture(scope="module")
def train(bn_model):
  return jaxport.convert(lambda x: bn_model(x, training=True), X)


@pytest.fixture(scope="module")
def infer(bn_model):
  return jaxport.convert(bn_model, X)


def moving_keys(params):
  return [k for k in params if "moving" in k]


def test_forms_agree_with_the_default_form_and_tf(bn_model, infer):
  fn, params = infer
  outputs, new_params = fn(params, X)
  assert_close(outputs, bn_model(X, training=False), 1e-5, 1e-5, "default vs TF")
  assert_close(fn.outputs_only(params, X), outputs, 0, 0, "outputs_only")
  changed_outputs, changed = fn.with_changed_params(params, X)
  assert_close(changed_outputs, outputs, 0, 0, "with_changed_params")
  assert changed == {}   # inference writes nothing
  assert set(new_params) == set(params)
  assert fn.returning("all") is fn
  assert fn.returning("outputs")(params, X).shape == (4, 3)
  with pytest.raises(UnsupportedValueError, match="call form"):
    fn.returning("everything")


def test_outputs_only_passes_the_oracle():
  w = tf.Variable(np.linspace(-1, 1, 18).reshape(6, 3).astype(np.float32))
  fn = lambda x: tf.tanh(tf.matmul(x, w))
  check(fn, X)
  jax_fn, params = jaxport.convert(fn, X)
  assert_close(jax.jit(jax_fn.outputs_only)(params, X), fn(X), 1e-5, 1e-5, "outputs_only under jit")


def test_changed_is_exactly_the_written_params_in_training(bn_model, train):
  fn, params = train
  outputs, new_params = fn(params, X)
  changed_outputs, changed = fn.with_changed_params(params, X)
  assert list(changed) == moving_keys(params) and len(changed) == 2
  for k, v in changed.items():
    np.testing.assert_array_equal(v, new_params[k])
  assert_close(changed_outputs, outputs, 0, 0)
  # Against TF: the moving statistics after one training step.
  tf_out = bn_model(X, training=True)
  assert_close(outputs, tf_out, 1e-5, 1e-5, "training outputs vs TF")
  for k in changed:
    assert_close(changed[k], fn.tf_variables[k], 1e-5, 1e-5, k)
    fn.tf_variables[k].assign(params[k])   # undo the TF step for the other tests
  assert {**params, **changed}.keys() == params.keys()


def test_forms_under_jit_grad_and_vmap(train):
  fn, params = train
  params = jax.device_put(dict(params))
  outputs, changed = jax.jit(fn.with_changed_params)(params, X)
  assert list(changed) == moving_keys(params)

  def everything(p, stacked):   # one compile: grads through two forms, and vmap
    loss = lambda p: (jnp.sum(fn.with_changed_params(p, X)[0] ** 2), fn.with_changed_params(p, X)[1])
    grads, aux = jax.grad(loss, has_aux=True)(p)
    expected = jax.grad(lambda p: jnp.sum(fn(p, X)[0] ** 2))(p)
    return grads, aux, expected, jax.vmap(lambda x: fn.outputs_only(p, x))(stacked)
  grads, aux, expected, batched = jax.jit(everything)(params, np.stack([X, 2 * X]))
  for k in params:
    np.testing.assert_allclose(grads[k], expected[k], rtol=1e-5, atol=1e-6)
  assert list(aux) == list(changed)
  np.testing.assert_allclose(batched[0], outputs, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(batched[1], fn.outputs_only(params, 2 * X), rtol=1e-5, atol=1e-6)


def test_outputs_only_compiles_without_param_outputs(train):
  fn, params = train
  n_out = len(jax.tree.leaves(jax.eval_shape(fn.outputs_only, params, X)))
  assert n_out == 1
  assert len(jax.tree.leaves(jax.eval_shape(fn.with_changed_params, params, X))) == 1 + 2
  assert len(jax.tree.leaves(jax.eval_shape(fn, params, X))) == 1 + len(params)
  compiled = jax.jit(fn.outputs_only).lower(params, X).compile()
  assert compiled.out_tree.num_leaves == 1
  assert compiled.memory_analysis().output_size_in_bytes == 4 * 3 * 4   # the logits only


def test_donation_reuses_param_buffers(train):
  fn, params = train
  step = jax.jit(fn, donate_argnums=0)
  params = jax.device_put(dict(params))
  reference = fn(params, X)
  for _ in range(2):   # the new params feed the next call; the old ones are consumed
    old = params
    outputs, params = step(params, X)
  np.testing.assert_allclose(outputs, reference[0], rtol=1e-5, atol=1e-6)
  assert params.keys() == old.keys()
  assert all(v.is_deleted() for v in old.values())   # XLA:CPU honours donation too
  with pytest.raises(RuntimeError, match="deleted"):
    np.asarray(old[moving_keys(old)[0]])


def test_static_argument_retrace_keeps_the_form(bn_model, infer):
  fn, params = infer
  _, changed = fn.with_changed_params(params, X, training=True)
  assert list(changed) == moving_keys(params)
  assert fn.with_changed_params(params, X)[1] == {}


def test_a_loop_that_assigns_reports_what_it_carries():
  v = tf.Variable(1.0, name="v")
  w = tf.Variable(2.0, name="w")

  @tf.function
  def fn(x):
    for _ in tf.range(3):
      v.assign_add(x)
    return v * w

  jax_fn, params = jaxport.convert(fn, np.float32(1.0))
  outputs, new_params = jax_fn(params, np.float32(1.0))
  outputs_changed, changed = jax_fn.with_changed_params(params, np.float32(1.0))
  assert float(outputs) == float(outputs_changed) == 8.0
  # The loop carries every param, so `w` counts as changed too (with its unchanged value).
  assert "v" in changed and set(changed) <= set(params)
  for k in changed:
    np.testing.assert_array_equal(changed[k], new_params[k])


def test_a_loaded_artifact_has_the_same_call_forms(train, tmp_path):
  fn, params = train
  jaxport.export(fn, params, path=tmp_path / "bn", platforms=("cpu",))
  loaded, loaded_params = jaxport.load(tmp_path / "bn")
  outputs, new_params = fn(params, X)
  _, changed = fn.with_changed_params(params, X)
  assert set(changed) == set(moving_keys(params))

  got, got_changed = jax.jit(loaded.with_changed_params)(loaded_params, X)
  assert list(got_changed) == [k for k in loaded.param_keys if k in changed]   # param_keys order
  assert_close(got, outputs, 1e-5, 1e-5, "loaded with_changed_params outputs")
  assert_close(got_changed, changed, 1e-5, 1e-5, "loaded changed params")
  assert_close(jax.jit(loaded.outputs_only)(loaded_params, X), outputs, 1e-5, 1e-5, "loaded outputs_only")
  all_out, all_params = jax.jit(loaded.returning("all"))(loaded_params, X)
  assert set(all_params) == set(params)
  assert_close(all_params, new_params, 1e-5, 1e-5, "loaded new params")
  with pytest.raises(UnsupportedValueError, match="not one of"):
    loaded.returning("everything")
