"""TF1 ref-variable ops (`VariableV2`, the ref scatters and the optimizers' `Apply*` ops) against a
TF Session: one graph holds every op on its own variables, run once."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert import _tf_compat
from jaxport.convert.interpreter import VariableRef
from oracle import run_rule
from tf1_oracle import v1_graph

V1 = tf.compat.v1
RAW = tf.raw_ops

APPLY_OPS = ["ApplyGradientDescent", "ApplyProximalGradientDescent", "SparseApplyProximalGradientDescent",
             "ApplyMomentum", "SparseApplyMomentum", "ApplyAdam", "ApplyAdaMax",
             "ApplyAdagrad", "SparseApplyAdagrad", "ApplyAdagradV2", "SparseApplyAdagradV2",
             "ApplyProximalAdagrad", "SparseApplyProximalAdagrad", "ApplyAdagradDA", "SparseApplyAdagradDA",
             "ApplyAdadelta", "SparseApplyAdadelta", "ApplyRMSProp", "SparseApplyRMSProp",
             "ApplyCenteredRMSProp", "SparseApplyCenteredRMSProp", "ApplyFtrl", "SparseApplyFtrl",
             "ApplyFtrlV2", "SparseApplyFtrlV2", "ApplyAddSign", "ApplyPowerSign"]
SCATTER_OPS = ["ScatterUpdate", "ScatterAdd", "ScatterSub", "ScatterMul", "ScatterDiv", "ScatterMax", "ScatterMin",
               "ScatterNdUpdate", "ScatterNdAdd", "ScatterNdSub", "ScatterNdMax", "ScatterNdMin"]
HYPER = {"lr": 0.1, "alpha": 0.1, "l1": 0.01, "l2": 0.02, "l2_shrinkage": 0.01, "lr_power": -0.5, "momentum": 0.9,
         "beta1": 0.9, "beta2": 0.999, "beta1_power": 0.9, "beta2_power": 0.99, "epsilon": 1e-3, "rho": 0.9,
         "logbase": 0.5, "sign_decay": 0.9, "beta": 0.9}
INIT = np.array([[0.5, 1.0], [1.5, 2.0], [0.25, 0.75]], np.float32)


def _ref_variable(name, value):
  with V1.variable_scope("v", use_resource=False):
    return V1.get_variable(name, initializer=value)


@pytest.mark.slow
def test_ref_apply_and_scatter_ops_update_params_like_tf():
  rs = np.random.RandomState(0)
  with v1_graph() as g:
    updates = []
    for op in APPLY_OPS:
      sparse = op.startswith("Sparse")
      kwargs = {}
      for arg in _tf_compat.op_def(op).input_arg:
        if arg.is_ref:
          kwargs[arg.name] = _ref_variable(f"{op}_{arg.name}", INIT + rs.uniform(size=INIT.shape).astype(np.float32))
        elif arg.name in ("grad", "delta"):
          kwargs[arg.name] = tf.constant(rs.normal(size=(2, 2) if sparse else INIT.shape).astype(np.float32))
        elif arg.name == "indices":
          kwargs[arg.name] = tf.constant([2, 0])
        elif arg.name == "global_step":
          kwargs[arg.name] = tf.constant(3, tf.int64)
        else:
          kwargs[arg.name] = tf.constant(HYPER[arg.name])
      updates.append(getattr(RAW, op)(**kwargs))
    for op in SCATTER_OPS:
      var = _ref_variable(op, INIT + 1.0)
      indices = tf.constant([[2], [0]]) if "Nd" in op else tf.constant([2, 0])
      updates.append(getattr(RAW, op)(ref=var, indices=indices,
                                      updates=tf.constant(rs.uniform(1, 2, size=(2, 2)).astype(np.float32))))
    with tf.control_dependencies(updates):
      done = tf.constant(0.0, name="done")
    variables = V1.global_variables()
    with V1.Session(graph=g) as sess:
      sess.run(V1.global_variables_initializer())
      initial = dict(zip([v.op.name for v in variables], sess.run(variables)))
      sess.run(done)
      expected = dict(zip([v.op.name for v in variables], sess.run(variables)))
  fn, params = jaxport.convert_graph_def(g.as_graph_def(), [], ["^done", "done"])
  assert set(params) == set(initial)
  for key, value in initial.items():
    np.testing.assert_array_equal(params[key], value)
  _, new = jax.jit(fn)(params)
  for key, value in expected.items():
    np.testing.assert_allclose(new[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_ref_identity_and_reads():
  """`Variable` (the oldest ref variable op), `RefIdentity`, and `_ReadRef`, which the v1 pass puts
  between a ref and an op that takes its value."""
  ref = run_rule("Variable", shape=[2], dtype=np.float32)
  assert ref == VariableRef("node")
  assert run_rule("RefIdentity", ref) is ref
  assert run_rule("_ReadRef", np.float32(2.0)) == 2.0   # a value (a cond's ref output) passes
