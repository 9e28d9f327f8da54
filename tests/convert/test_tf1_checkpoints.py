"""TF1 checkpoints: `convert_graph_def(meta_or_graph, inputs, outputs, variables=prefix)` reads the
variables as the graph's Saver restores them (`convert/checkpoints.py`). TF is the oracle: a Session
that trained, saved, and goes on training."""
import json
import os
import re

import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.errors import ModelFileError
from oracle import assert_close
from tf1_oracle import v1_graph

v1 = tf.compat.v1
IDS = np.array([[1, 3, 3], [0, 7, 2]], np.int64)
Y = np.array([[0.5], [-1.0]], np.float32)


def _trained(tmp_path, saver_keys=None):
  """A graph with a partitioned ref embedding, a resource dense layer and Adam, trained two steps in a
  Session and saved; then two more steps. Returns the graph, the checkpoint prefix, the prediction
  at the save, the later losses and the final variables."""
  with v1_graph() as g:
    ids = v1.placeholder(tf.int64, [2, 3], name="ids")
    y = v1.placeholder(tf.float32, [2, 1], name="y")
    with v1.variable_scope("model", initializer=v1.random_normal_initializer(seed=1)):
      table = v1.get_variable("table", [11, 4], partitioner=v1.fixed_size_partitioner(3), use_resource=False)
      w = v1.get_variable("w", [4, 1], use_resource=True)
    pred = tf.matmul(tf.reduce_mean(v1.nn.embedding_lookup(table, ids), 1), w, name="pred")
    loss = tf.reduce_mean(tf.square(pred - y))
    train = v1.train.AdamOptimizer(0.1).minimize(loss, global_step=v1.train.get_or_create_global_step())
    with tf.control_dependencies([train]):
      tf.identity(loss, name="loss_after")
    variables = v1.global_variables()
    saver = v1.train.Saver(saver_keys(variables) if saver_keys else None)
  with v1.Session(graph=g) as sess:
    sess.run(v1.global_variables_initializer())
    for _ in range(2):
      sess.run("loss_after:0", {"ids:0": IDS, "y:0": Y})
    prefix = saver.save(sess, os.path.join(tmp_path, "model.ckpt"), global_step=2)
    prediction = sess.run("pred:0", {"ids:0": IDS})
    losses = [sess.run("loss_after:0", {"ids:0": IDS, "y:0": Y}) for _ in range(2)]
    final = dict(zip([v.op.name for v in variables], sess.run(variables)))
  return g, prefix, prediction, losses, final


def _check(graph_def, prefix, prediction, losses, final):
  jax_fn, params = jaxport.convert_graph_def(graph_def, ["ids"], "pred", variables=prefix)
  assert_close(jax.jit(jax_fn)(params, IDS)[0], prediction, 1e-6, 1e-6, "prediction at the save")
  jax_fn, state = jaxport.convert_graph_def(graph_def, ["ids", "y"], "loss_after", variables=prefix)
  step = jax.jit(jax_fn)
  for expected in losses:   # training goes on from the checkpoint as in the Session
    loss, state = step(state, IDS, Y)
    assert_close(loss, expected, 1e-5, 1e-6, "loss")
  for key, value in final.items():
    assert_close(state[key], value, 1e-5, 1e-6, key)


def test_meta_file_and_checkpoint_resume_training_under_jit(tmp_path):
  """The `.meta` file and the prefix Saver.save returned: partitioned parts sliced from the full
  tensor, a resource variable, Adam's slots and the global step."""
  g, prefix, *expected = _trained(tmp_path)
  assert {"model/table/part_0", "model/table/part_2"} <= {n.name for n in g.as_graph_def().node}
  assert "model/table" in tf.train.load_checkpoint(prefix).get_variable_to_shape_map()   # saved whole
  _check(prefix + ".meta", prefix, *expected)
  meta = tf.compat.v1.MetaGraphDef()
  with open(prefix + ".meta", "rb") as f:
    meta.ParseFromString(f.read())
  _check(meta, prefix, *expected)   # the proto too


def test_checkpoint_keys_follow_the_savers_restore_ops(tmp_path):
  """A Saver with its own keys (`var_list` as a dict): the graph's restore ops say which key is
  which variable."""
  def renamed(variables):   # the parts of one partitioned variable (or slot) under one key
    keys = {}
    for v in variables:
      keys.setdefault("renamed_" + re.sub(r"/part_\d+", "", v.op.name).replace("/", "_"), []).append(v)
    return {k: (parts[0] if len(parts) == 1 else parts) for k, parts in keys.items()}

  g, prefix, *expected = _trained(tmp_path, renamed)
  assert not any(k.startswith("model/") for k in tf.train.load_checkpoint(prefix).get_variable_to_shape_map())
  _check(g.as_graph_def(), prefix, *expected)


def test_graph_without_a_saver_reads_by_name_and_parts_in_order(tmp_path):
  """Without the Saver's nodes each variable is read under its own name, and the parts of a
  partitioned variable as consecutive slices of the full one."""
  g, prefix, *expected = _trained(tmp_path)
  graph_def = g.as_graph_def()
  kept = [n for n in graph_def.node if not n.name.startswith("save/")]
  del graph_def.node[:]
  graph_def.node.extend(kept)
  _check(graph_def, prefix, *expected)


def test_bad_checkpoints_raise_model_file_errors(tmp_path):
  g, prefix, *_ = _trained(tmp_path)
  with pytest.raises(ModelFileError, match="is not a TF checkpoint prefix"):
    jaxport.convert_graph_def(prefix + ".meta", ["ids"], "pred", variables=os.path.join(tmp_path, "nothing"))
  with v1_graph() as other:   # a checkpoint of another graph: its variables are not there
    v = v1.get_variable("other", [2], initializer=v1.zeros_initializer())
    saver = v1.train.Saver([v])
  with v1.Session(graph=other) as sess:
    sess.run(v1.global_variables_initializer())
    other_prefix = saver.save(sess, os.path.join(tmp_path, "other.ckpt"))
  graph_def = g.as_graph_def()
  kept = [n for n in graph_def.node if not n.name.startswith("save/")]
  del graph_def.node[:]
  graph_def.node.extend(kept)
  with pytest.raises(ModelFileError, match="holds no 'model/w' for variable 'model/w'"):
    jaxport.convert_graph_def(graph_def, ["ids"], "pred", variables=other_prefix)


def test_inspect_reads_a_meta_file(tmp_path, capsys):
  """`jaxport inspect model.ckpt-2.meta`: every op of the graph native; the Saver's file I/O
  (SaveV2, RestoreV2), which `variables=` replaces, is not listed."""
  from jaxport import cli
  _, prefix, *_ = _trained(tmp_path)
  assert cli.main(["inspect", prefix + ".meta", "--json"]) == 0
  report = json.loads(capsys.readouterr().out)
  ops = {row["op"]: row["tier"] for r in report["functions"] for row in r["rows"]}
  assert {"DynamicPartition", "ParallelDynamicStitch", "ScatterAdd", "ResourceApplyAdam"} <= set(ops)
  assert set(ops.values()) == {"native"} and not {"SaveV2", "RestoreV2"} & set(ops), ops
