"""Optimizer training ops (`ResourceApply*`, `ResourceSparseApply*`) and scatters into variables
(`ResourceScatter*`, `ResourceScatterNd*`, `ResourceStridedSliceAssign`) against TF.

Each test applies several ops to tf.Variables in one function, converts it, runs it eager and
under jit, then runs it in TF and compares the outputs and `new_params` with TF's variables.
"""
import jax
import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import jaxport
from jaxport.convert.registry import get_rule
from oracle import assert_close

RAW = tf.raw_ops
SHAPE = (4, 3)
ACCUM, ADADELTA, FTRL = "var accum", "var accum accum_update", "var accum linear"
DA = "var gradient_accumulator gradient_squared_accumulator"
RMS, CENTERED = "var ms mom", "var mg ms mom"


def _variables(prefix: str, n: int, shape=SHAPE, seed=0) -> list[tf.Variable]:
  """`n` variables: the first normal (the weights), the rest positive (accumulators)."""
  rs = np.random.RandomState(seed)
  values = [rs.normal(size=shape)] + [rs.uniform(0.1, 1.0, size=shape) for _ in range(n - 1)]
  return [tf.Variable(v.astype(np.float32), name=f"{prefix}_{i}") for i, v in enumerate(values)]


def _grad(seed=1, shape=SHAPE) -> np.ndarray:
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _check_updates(fn, variables, *args, atol=1e-5):
  """`fn` converted, run eager and jitted, matches TF: outputs and every variable after the call."""
  def with_reads(*a):   # the values after the updates are outputs too
    fn(*a)
    return [v.read_value() for v in variables]

  jax_fn, params = jaxport.convert(with_reads, *args)
  results = [jax_fn(params, *args), jax.jit(jax_fn)(params, *args)]
  expected = tf.function(with_reads)(*args)   # updates the TF variables
  for (outs, new), how in zip(results, ("eager", "jit")):
    assert_close(outs, expected, atol, atol, how)
    for key, var in jax_fn.tf_variables.items():
      assert_close(new[key], var, atol, atol, f"{how}: {key}")
  return jax_fn


def _kw(variables, names: str) -> dict:
  """Raw-op keyword arguments: the handles of `variables` under the op's input `names`."""
  return {name: v.handle for name, v in zip(names.split(), variables, strict=True)}


# --------------------------------------------------------------------------- dense updates


def test_gradient_descent_momentum_and_sign_methods():
  gd, pgd, pgd0 = _variables("gd", 1), _variables("pgd", 1), _variables("pgd0", 1)
  mom, nmom, kmom, knmom = (_variables(p, 2) for p in ("mom", "nmom", "kmom", "knmom"))
  add_sign, power_sign = _variables("add_sign", 2), _variables("power_sign", 2)
  variables = gd + pgd + pgd0 + mom + nmom + kmom + knmom + add_sign + power_sign

  def fn(g, lr):
    RAW.ResourceApplyGradientDescent(var=gd[0].handle, alpha=lr, delta=g)
    RAW.ResourceApplyProximalGradientDescent(var=pgd[0].handle, alpha=lr, l1=0.05, l2=0.2, delta=g)
    RAW.ResourceApplyProximalGradientDescent(var=pgd0[0].handle, alpha=lr, l1=0.0, l2=0.2, delta=g)
    for (var, accum), nesterov in ((mom, False), (nmom, True)):
      RAW.ResourceApplyMomentum(var=var.handle, accum=accum.handle, lr=lr, grad=g, momentum=0.9,
                                use_nesterov=nesterov)
    for (var, accum), nesterov in ((kmom, False), (knmom, True)):
      RAW.ResourceApplyKerasMomentum(var=var.handle, accum=accum.handle, lr=lr, grad=g, momentum=0.9,
                                     use_nesterov=nesterov)
    RAW.ResourceApplyAddSign(var=add_sign[0].handle, m=add_sign[1].handle, lr=lr, alpha=1.0, sign_decay=0.5,
                             beta=0.9, grad=g)
    RAW.ResourceApplyPowerSign(var=power_sign[0].handle, m=power_sign[1].handle, lr=lr, logbase=np.e,
                               sign_decay=0.5, beta=0.9, grad=g)

  _check_updates(fn, variables, _grad(), np.float32(0.1))


def test_adam_family():
  adam, nadam, ams, adamax = (_variables(p, n) for p, n in (("adam", 3), ("nadam", 3), ("ams", 4), ("adamax", 3)))

  def fn(g, lr):
    for (var, m, v), nesterov in ((adam, False), (nadam, True)):
      RAW.ResourceApplyAdam(var=var.handle, m=m.handle, v=v.handle, beta1_power=0.9 ** 3, beta2_power=0.999 ** 3,
                            lr=lr, beta1=0.9, beta2=0.999, epsilon=1e-7, grad=g, use_nesterov=nesterov)
    RAW.ResourceApplyAdamWithAmsgrad(**_kw(ams, "var m v vhat"), beta1_power=0.81, beta2_power=0.998, lr=lr, beta1=0.9,
                                     beta2=0.999, epsilon=1e-7, grad=g)
    RAW.ResourceApplyAdaMax(**_kw(adamax, "var m v"), beta1_power=0.81, lr=lr, beta1=0.9, beta2=0.999,
                            epsilon=1e-7, grad=g)

  _check_updates(fn, adam + nadam + ams + adamax, _grad(), np.float32(0.01))


def test_adagrad_family_and_adadelta():
  names = ("adagrad", "adagrad_frozen", "adagrad_v2", "padagrad", "padagrad0", "adadelta")
  adagrad, frozen, v2, prox, prox0, adadelta = (_variables(p, 3 if p == "adadelta" else 2) for p in names)
  da, da0 = _variables("adagrad_da", 3), _variables("adagrad_da0", 3)

  def fn(g, lr):
    RAW.ResourceApplyAdagrad(**_kw(adagrad, ACCUM), lr=lr, grad=g)
    RAW.ResourceApplyAdagrad(**_kw(frozen, ACCUM), lr=lr, grad=g, update_slots=False)
    RAW.ResourceApplyAdagradV2(**_kw(v2, ACCUM), lr=lr, epsilon=1e-3, grad=g)
    RAW.ResourceApplyProximalAdagrad(**_kw(prox, ACCUM), lr=lr, l1=0.05, l2=0.1, grad=g)
    RAW.ResourceApplyProximalAdagrad(**_kw(prox0, ACCUM), lr=lr, l1=0.0, l2=0.1, grad=g)
    for slots, l1 in ((da, 0.05), (da0, 0.0)):
      RAW.ResourceApplyAdagradDA(**_kw(slots, DA), grad=g, lr=lr, l1=l1, l2=0.1, global_step=tf.constant(3, tf.int64))
    RAW.ResourceApplyAdadelta(**_kw(adadelta, ADADELTA), lr=lr, rho=0.95, epsilon=1e-6, grad=g)

  _check_updates(fn, adagrad + frozen + v2 + prox + prox0 + da + da0 + adadelta, _grad(), np.float32(0.1))


def test_rms_prop_and_ftrl():
  rms, centered = _variables("rms", 3), _variables("centered_rms", 4)
  ftrls = [_variables(f"ftrl{i}", 3) for i in range(4)]

  def fn(g, lr):
    RAW.ResourceApplyRMSProp(**_kw(rms, RMS), lr=lr, rho=0.9, momentum=0.5, epsilon=1e-7, grad=g)
    RAW.ResourceApplyCenteredRMSProp(**_kw(centered, CENTERED), lr=lr, rho=0.9, momentum=0.5, epsilon=0.5, grad=g)
    RAW.ResourceApplyFtrl(**_kw(ftrls[0], FTRL), grad=g, lr=lr, l1=0.01, l2=0.1, lr_power=-0.5)
    RAW.ResourceApplyFtrl(**_kw(ftrls[1], FTRL), grad=g, lr=lr, l1=0.01, l2=0.1, lr_power=-0.3,
                          multiply_linear_by_lr=True)
    RAW.ResourceApplyFtrlV2(**_kw(ftrls[2], FTRL), grad=g, lr=lr, l1=0.01, l2=0.1, l2_shrinkage=0.2, lr_power=-0.5)
    RAW.ResourceApplyFtrlV2(**_kw(ftrls[3], FTRL), grad=g, lr=lr, l1=0.01, l2=0.1, l2_shrinkage=0.2, lr_power=-0.5,
                            multiply_linear_by_lr=True)

  _check_updates(fn, rms + centered + sum(ftrls, []), _grad(), np.float32(0.1))


def test_training_ops_are_state_writing_rules():
  for op in ("ResourceApplyAdam", "ResourceSparseApplyAdagradV2", "ResourceScatterAdd", "ResourceStridedSliceAssign"):
    rule = get_rule(op)
    assert rule.writes_state and rule.structural and rule.stateful, op


def test_variables_captured_only_by_their_handle_become_params():
  """Raw training ops on `v.handle` leave the variables out of `ConcreteFunction.variables`."""
  var, accum = _variables("by_handle", 2)

  def fn(g):
    RAW.ResourceApplyAdagrad(var=var.handle, accum=accum.handle, lr=0.1, grad=g)
    return tf.reduce_sum(g)

  jax_fn, params = jaxport.convert(fn, _grad())
  assert {id(v) for v in jax_fn.tf_variables.values()} == {id(var), id(accum)}
  _, new_params = jax_fn(params, _grad())
  tf.function(fn)(_grad())
  for key, variable in jax_fn.tf_variables.items():
    assert_close(new_params[key], variable, 1e-6, 1e-6, key)


def test_training_ops_inside_a_loop_carry_their_updates():
  var, accum = _variables("loop", 2, shape=(3,))

  def fn(g):
    for _ in tf.range(3):   # a While whose body writes state
      RAW.ResourceApplyMomentum(var=var.handle, accum=accum.handle, lr=0.1, grad=g * var, momentum=0.9)
      RAW.ResourceScatterAdd(resource=var.handle, indices=[1], updates=[0.5])

  _check_updates(fn, [var, accum], _grad(shape=(3,)))


# --------------------------------------------------------------------------- sparse updates


@pytest.mark.slow   # ~10-15 s: many ops, run eagerly op by op
def test_sparse_updates_touch_only_the_indexed_rows():
  names = {"s_adagrad": ACCUM, "s_adagrad_v2": ACCUM, "s_padagrad": ACCUM, "s_pgd": "var", "s_adagrad_da": DA,
           "s_mom": ACCUM, "s_nmom": ACCUM, "s_kmom": ACCUM, "s_knmom": ACCUM, "s_rms": RMS, "s_centered": CENTERED,
           "s_ftrl": FTRL, "s_ftrl_v2": FTRL, "s_adadelta": ADADELTA}
  slots = {name: _variables(name, len(inputs.split())) for name, inputs in names.items()}
  h = {name: _kw(slots[name], inputs) for name, inputs in names.items()}

  def fn(g, indices, lr):
    RAW.ResourceSparseApplyAdagrad(**h["s_adagrad"], lr=lr, grad=g, indices=indices)
    RAW.ResourceSparseApplyAdagradV2(**h["s_adagrad_v2"], lr=lr, epsilon=1e-3, grad=g, indices=indices)
    RAW.ResourceSparseApplyProximalAdagrad(**h["s_padagrad"], lr=lr, l1=0.05, l2=0.1, grad=g, indices=indices)
    RAW.ResourceSparseApplyProximalGradientDescent(**h["s_pgd"], alpha=lr, l1=0.05, l2=0.1, grad=g, indices=indices)
    RAW.ResourceSparseApplyAdagradDA(**h["s_adagrad_da"], grad=g, indices=indices, lr=lr, l1=0.05, l2=0.1,
                                     global_step=tf.constant(2, tf.int64))
    for name, nesterov in (("s_mom", False), ("s_nmom", True)):
      RAW.ResourceSparseApplyMomentum(**h[name], lr=lr, grad=g, indices=indices, momentum=0.9, use_nesterov=nesterov)
    for name, nesterov in (("s_kmom", False), ("s_knmom", True)):
      RAW.ResourceSparseApplyKerasMomentum(**h[name], lr=lr, grad=g, indices=indices, momentum=0.9,
                                           use_nesterov=nesterov)
    RAW.ResourceSparseApplyRMSProp(**h["s_rms"], lr=lr, rho=0.9, momentum=0.5, epsilon=1e-7, grad=g, indices=indices)
    RAW.ResourceSparseApplyCenteredRMSProp(**h["s_centered"], lr=lr, rho=0.9, momentum=0.5, epsilon=0.5, grad=g,
                                           indices=indices)
    RAW.ResourceSparseApplyFtrl(**h["s_ftrl"], grad=g, indices=indices, lr=lr, l1=0.01, l2=0.1, lr_power=-0.5)
    RAW.ResourceSparseApplyFtrlV2(**h["s_ftrl_v2"], grad=g, indices=indices, lr=lr, l1=0.01, l2=0.1,
                                  l2_shrinkage=0.2, lr_power=-0.5)
    RAW.ResourceSparseApplyAdadelta(**h["s_adadelta"], lr=lr, rho=0.95, epsilon=1e-6, grad=g, indices=indices)

  indices = np.array([3, 0], np.int32)
  _check_updates(fn, sum(slots.values(), []), _grad(shape=(2, 3)), indices, np.float32(0.1))


# --------------------------------------------------------------------------- scatters and slice assignment


@pytest.mark.slow   # ~10-15 s: many ops, run eagerly op by op
def test_resource_scatters():
  ops = ("ResourceScatterUpdate", "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul",
         "ResourceScatterDiv", "ResourceScatterMax", "ResourceScatterMin")
  nd_ops = ("ResourceScatterNdUpdate", "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdMax",
            "ResourceScatterNdMin")
  rows = {op: _variables(f"rows_{op}", 1, seed=2)[0] for op in ops}
  scalar = {op: _variables(f"scalar_{op}", 1, seed=3)[0] for op in ops}
  nd = {op: _variables(f"nd_{op}", 1, seed=4)[0] for op in nd_ops}

  def fn(updates, nd_updates):
    for op in ops:   # 2-d indices, with a repeated row except for the update
      indices = [[0, 2]] if op == "ResourceScatterUpdate" else [[0, 2], [2, 1]]
      getattr(RAW, op)(resource=rows[op].handle, indices=indices, updates=updates[: len(indices)] + 1.5)
      getattr(RAW, op)(resource=scalar[op].handle, indices=[3, 1], updates=tf.constant(2.0))
    for op in nd_ops:
      getattr(RAW, op)(ref=nd[op].handle, indices=[[1, 2], [3, 0], [0, 0]], updates=nd_updates)

  updates = np.random.RandomState(5).normal(size=(2, 2, 3)).astype(np.float32)
  _check_updates(fn, [*rows.values(), *scalar.values(), *nd.values()], updates, _grad(seed=6, shape=(3,)))


@pytest.mark.slow   # ~10 s under load: each eager scatter compiles once
def test_resource_strided_slice_assign_with_every_mask():
  cube = [tf.Variable(np.zeros((4, 5, 3), np.float32), name=f"cube{i}") for i in range(6)]

  def fn(x, i):
    cube[0][1:3, ::2].assign(tf.ones((2, 3, 3)) * x)           # begin/end and strides
    cube[1][::-1, 1, tf.newaxis].assign(tf.fill((4, 1, 3), x))  # negative stride, shrink, new axis
    cube[2][..., 1].assign(tf.fill((4, 5), x))                  # ellipsis
    cube[3][-1, :, ::-2].assign(tf.fill((5, 2), x))             # negative begin, reversed
    cube[4][i].assign(tf.fill((5, 3), x))                      # traced single-element index
    cube[5][:, i, 2].assign(tf.fill((4,), x))                  # traced index between slices

  graph = tf.function(fn).get_concrete_function(np.float32(0), np.int32(0)).graph
  assert {n.op for n in graph.as_graph_def().node} >= {"ResourceStridedSliceAssign"}
  _check_updates(fn, cube, np.float32(2.5), np.int32(-2))


# --------------------------------------------------------------------------- Keras training steps

LEGACY = tf_keras.optimizers.legacy


def _training_step(lib, optimizer, *, embedding: bool):
  """A tiny model, its optimizer's slots built, and `step(x, y)`: one `apply_gradients` on the MSE."""
  lib.utils.set_random_seed(0)
  layers = lib.layers
  if embedding:
    inputs = layers.InputLayer(input_shape=(2,)) if lib is tf_keras else layers.Input((2,))
    model = lib.Sequential([inputs, layers.Embedding(6, 3), layers.Flatten(), layers.Dense(1)])
    x = np.array([[1, 4], [4, 0], [2, 1]], np.int32)
  else:
    inputs = layers.InputLayer(input_shape=(3,)) if lib is tf_keras else layers.Input((3,))
    model = lib.Sequential([inputs, layers.Dense(4, activation="tanh"), layers.Dense(1)])
    x = np.random.RandomState(0).normal(size=(5, 3)).astype(np.float32)
  y = np.random.RandomState(1).normal(size=(len(x), 1)).astype(np.float32)
  model.compile(optimizer=optimizer, loss="mse")
  variables = model.trainable_variables
  if hasattr(optimizer, "_create_all_weights"):   # tf_keras legacy optimizers
    optimizer._create_all_weights(variables)
  else:
    optimizer.build(variables)

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    model.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  return step, x, y


def _graph_ops(fn, *args) -> set[str]:
  graph = tf.function(fn).get_concrete_function(*args).graph.as_graph_def()
  return {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}


KERAS_STEPS = {   # id: (library, optimizer factory, embedding model, the training ops it must emit)
    "tf_keras-sgd-nesterov": (tf_keras, lambda: LEGACY.SGD(0.1, momentum=0.9, nesterov=True), False,
                              {"ResourceApplyKerasMomentum"}),
    "tf_keras-adam": (tf_keras, lambda: LEGACY.Adam(0.01), False, {"ResourceApplyAdam"}),
    "tf_keras-rmsprop-centered": (tf_keras, lambda: LEGACY.RMSprop(0.01, momentum=0.5, centered=True), False,
                                  {"ResourceApplyCenteredRMSProp"}),
    "tf_keras-adagrad": (tf_keras, lambda: LEGACY.Adagrad(0.1), False, {"ResourceApplyAdagradV2"}),
    "tf_keras-embedding-adagrad": (tf_keras, lambda: LEGACY.Adagrad(0.1), True, {"ResourceSparseApplyAdagradV2"}),
    "tf_keras-embedding-sgd-momentum": (tf_keras, lambda: LEGACY.SGD(0.1, momentum=0.9), True,
                                        {"ResourceSparseApplyKerasMomentum"}),
    "tf_keras-new-adam-embedding": (tf_keras, lambda: tf_keras.optimizers.Adam(0.01), True, {"ResourceScatterAdd"}),
    "keras3-adam": (keras, lambda: keras.optimizers.Adam(0.01), False, {"AssignSubVariableOp"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(KERAS_STEPS))
def test_keras_training_steps_match_tf_after_three_steps(case):
  lib, make_optimizer, embedding, expected_ops = KERAS_STEPS[case]
  step, x, y = _training_step(lib, make_optimizer(), embedding=embedding)
  assert expected_ops <= _graph_ops(step, x, y)
  jax_fn, initial = jaxport.convert(step, x, y)
  # Sparse gradients are deduplicated with tf.unique: eagerly its outputs have TF's shapes, under
  # jit they are padded (convert/padded_rows.py); x repeats ids, so the padding is exercised.
  runs = {}
  for name, run in [("jit", jax.jit(jax_fn))] + ([("eager", jax_fn)] if embedding else []):
    params, losses = initial, []
    for _ in range(3):   # new_params fed back as params
      loss, new_params = run(params, x, y)
      params = {**params, **new_params}
      losses.append(loss)
    runs[name] = params, losses
  tf_step = tf.function(step)
  tf_losses = [tf_step(x, y) for _ in range(3)]
  slots = [key for key, var in jax_fn.tf_variables.items() if not var.trainable]
  assert slots, "the optimizer's slots are params"
  for name, (params, losses) in runs.items():
    assert_close(losses, tf_losses, 1e-5, 1e-5, f"{name} losses")
    for key, var in jax_fn.tf_variables.items():
      assert_close(params[key], var, 1e-5, 0, f"{name} {key}")


TF1_OPTIMIZERS = {   # tf.compat.v1.train optimizers: dense ops for a matrix, sparse ops for an embedding table
    "momentum": (lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True),
                 {"ResourceApplyMomentum", "ResourceSparseApplyMomentum"}),
    "ftrl": (lambda: tf.compat.v1.train.FtrlOptimizer(0.1, l1_regularization_strength=0.01,
                                                      l2_shrinkage_regularization_strength=0.1),
             {"ResourceApplyFtrlV2", "ResourceSparseApplyFtrlV2"}),
    "centered-rmsprop": (lambda: tf.compat.v1.train.RMSPropOptimizer(0.01, momentum=0.5, centered=True),
                         {"ResourceApplyCenteredRMSProp", "ResourceSparseApplyCenteredRMSProp"}),
    "adam": (lambda: tf.compat.v1.train.AdamOptimizer(0.01), {"ResourceApplyAdam", "ResourceScatterAdd"}),
    "adadelta": (lambda: tf.compat.v1.train.AdadeltaOptimizer(1.0),
                 {"ResourceApplyAdadelta", "ResourceSparseApplyAdadelta"}),
    "proximal-adagrad": (lambda: tf.compat.v1.train.ProximalAdagradOptimizer(0.1, l1_regularization_strength=0.01),
                         {"ResourceApplyProximalAdagrad", "ResourceSparseApplyProximalAdagrad"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TF1_OPTIMIZERS))
def test_tf1_training_steps_match_tf_after_three_steps(name):
  make_optimizer, expected_ops = TF1_OPTIMIZERS[name]
  optimizer = make_optimizer()
  rs = np.random.RandomState(0)
  w = tf.Variable(rs.normal(size=(3, 2)).astype(np.float32), name=f"tf1_{name}_w")
  table = tf.Variable(rs.normal(size=(6, 2)).astype(np.float32), name=f"tf1_{name}_table")

  def step(x, ids):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + tf.reduce_sum(tf.gather(table, ids), 1)))
    optimizer.apply_gradients(zip(tape.gradient(loss, [w, table]), [w, table]))
    return loss

  x, ids = rs.normal(size=(4, 3)).astype(np.float32), np.array([[1, 4], [4, 0], [2, 1], [5, 5]], np.int32)
  assert expected_ops <= _graph_ops(step, x, ids)
  jax_fn, params = jaxport.convert(step, x, ids)   # the first trace creates the slots
  assert len(params) > 2, "the optimizer's slots are params"
  results = {}
  for name, run in [("eager", jax_fn), ("jit", jax.jit(jax_fn))]:   # Unique's outputs padded under jit
    state = params
    for _ in range(3):
      _, new_params = run(state, x, ids)
      state = {**state, **new_params}
    results[name] = state
  tf_step = tf.function(step)
  for _ in range(3):
    tf_step(x, ids)
  for name, state in results.items():
    for key, var in jax_fn.tf_variables.items():
      assert_close(state[key], var, 1e-5, 1e-5, f"{name} {key}")
