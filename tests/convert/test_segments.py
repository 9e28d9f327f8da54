"""Eager calls of graphs that cannot run as one jit (shapes that depend on values) run in segments:
each run of nodes that traces is one cached jit, the nodes that need values run op by op (segments.py).
Results match TF and the op-by-op interpreter (`eager_jit` off), variables and keys included."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert import api, segments
from jaxport.convert.host_callback import HostCallbackWarning
from test_eager_jit import _deep

RS = np.random.RandomState(0)
X = RS.normal(size=(4, 8)).astype(np.float32)


def _masked(x):
  kept = tf.boolean_mask(_deep(x), x > 0)   # its length depends on the values
  return tf.reduce_sum(_deep(kept)), tf.shape(kept)[0]


def _op_by_op(jax_fn, *args, **kwargs):
  with jaxport.override_config("eager_jit", False):
    return jax_fn(*args, **kwargs)


def _summary(jax_fn) -> dict:
  return segments.summary(jax_fn._graph)   # pylint: disable=protected-access


def _check_masked(jax_fn, params, x):
  out, _ = jax_fn(params, x)
  want = _masked(x)
  np.testing.assert_allclose(out[0], want[0], rtol=2e-6)
  assert int(out[1]) == int(want[1])


def test_only_the_value_dependent_nodes_run_op_by_op():
  jax_fn, params = jaxport.convert(tf.function(_masked), X)
  for x in (X, X[::-1], X * 2.0):   # as many positives, elsewhere: the indices are arguments of one jit
    _check_masked(jax_fn, params, x)
  summary = _summary(jax_fn)
  assert summary["op_by_op"] == ["Where"]   # boolean_mask's indices
  nodes = [len(run["nodes"]) for run in summary["runs"]]
  assert len(nodes) == 2 and min(nodes) > api.EAGER_JIT_MIN_NODES   # the deep parts before and after
  assert [run["signatures"] for run in summary["runs"]] == [1, 1]


class _Clock:
  """A perf_counter that advances one second per reading: a compile and an op-by-op run each take 1 s."""

  def __init__(self):
    self.now = 0.0

  def perf_counter(self):
    self.now += 1.0
    return self.now


def test_a_new_size_compiles_once_running_it_op_by_op_has_cost_a_compile(monkeypatch):
  monkeypatch.setattr(segments, "time", _Clock())
  jax_fn, params = jaxport.convert(tf.function(_masked), X)
  _check_masked(jax_fn, params, X)   # the first size compiles at once
  after = lambda: _summary(jax_fn)["runs"][-1]  # noqa: E731
  assert (after()["signatures"], after()["op_by_op"]) == (1, 0)
  _check_masked(jax_fn, params, -X)   # a new count of positives: op by op (1 s spent, the compile took 1 s)
  assert (after()["signatures"], after()["op_by_op"]) == (1, 1)
  _check_masked(jax_fn, params, -X[::-1])   # the same count again: worth its compile now
  assert (after()["signatures"], after()["op_by_op"]) == (2, 0)
  _check_masked(jax_fn, params, -X)
  assert after()["signatures"] == 2
  # a new size's first run op by op (its ops' kernels compiled for it too) cost as much as a compile:
  # the next new size compiles at once
  _check_masked(jax_fn, params, X + 0.5)
  assert (after()["signatures"], after()["op_by_op"]) == (3, 0)


def test_when_a_new_signature_compiles():
  run = segments._Run(0, 1, (), (), (), {})   # pylint: disable=protected-access
  worth = lambda sig: segments._worth_compiling(run, sig)  # noqa: E731 pylint: disable=protected-access
  assert worth("a")   # the run's first compile
  run.compile_s = 1.0
  assert not worth("a")   # a new size: op by op first
  run.op_by_op, run.first_op_s = {"a": 0.5}, 0.5
  assert not worth("a") and not worth("b")
  run.op_by_op["a"] = 1.0   # op by op has cost a compile
  assert worth("a") and not worth("b")
  run.first_op_s = 1.5   # new sizes cost more op by op than compiled
  assert worth("b")
  run.compiled = dict.fromkeys(range(segments.MOST_VARIANTS))
  assert not worth("a") and not worth("b")


def test_a_run_compiles_at_most_most_variants_sizes(monkeypatch):
  monkeypatch.setattr(segments, "time", _Clock())
  monkeypatch.setattr(segments, "MOST_VARIANTS", 2)
  jax_fn, params = jaxport.convert(tf.function(_masked), X)
  values = np.linspace(-1.0, 1.0, X.size, dtype=np.float32)
  for shift in np.sort(values)[::-1][:4] - 1e-3:   # 1, 2, 3, 4 positives, each three times
    for _ in range(3):
      _check_masked(jax_fn, params, (values - shift).reshape(X.shape))
  assert _summary(jax_fn)["runs"][-1]["signatures"] == 2


def test_variables_and_random_draws_match_op_by_op():
  counter = tf.Variable(0.0, name="counter")
  scale = tf.Variable(2.0, name="scale")

  @tf.function
  def step(x):
    counter.assign_add(1.0)
    noisy = _deep(x + tf.random.normal(tf.shape(x)))
    kept = tf.boolean_mask(noisy, x > 0)
    scale.assign(scale * 1.5)
    return _deep(kept) * scale + counter

  jax_fn, params = jaxport.convert(step, X)
  key = jax.random.key(7)
  out, new_params = jax_fn(params, X, rng=key)
  want, want_params = _op_by_op(jax_fn, params, X, rng=key)
  np.testing.assert_allclose(out, want, rtol=1e-6)
  assert {k: float(v) for k, v in new_params.items()} == {k: float(v) for k, v in want_params.items()}
  assert float(new_params["counter"]) == 1.0 and float(new_params["scale"]) == 3.0
  assert _summary(jax_fn)["op_by_op"] == ["Where"]


def test_padded_uniques_and_nested_functions_run_as_in_tf():
  @tf.function
  def inner(x):   # a function the outer one calls: segmented inside too
    ids = tf.cast(tf.abs(_deep(x)) * 3, tf.int32)
    values, index = tf.unique(tf.reshape(ids, [-1]))   # padded under jit: op by op here
    return tf.reduce_sum(_deep(tf.cast(values, tf.float32))) + tf.cast(tf.reduce_sum(index), tf.float32)

  @tf.function
  def outer(x):
    return inner(tf.boolean_mask(x, x > 0) * 2.0)

  jax_fn, params = jaxport.convert(outer, X)
  for x in (X, X - 0.3):
    np.testing.assert_allclose(jax_fn(params, x)[0], outer(x), rtol=2e-6)
    np.testing.assert_allclose(_op_by_op(jax_fn, params, x)[0], outer(x), rtol=2e-6)


def test_strings_from_host_callbacks_cross_runs():
  @tf.function
  def lengths(x):
    text = tf.strings.as_string(tf.boolean_mask(_deep(x), x > 0), precision=3)   # a host callback
    return tf.reduce_sum(_deep(tf.cast(tf.strings.length(text), tf.float32)))

  with pytest.warns(HostCallbackWarning):
    jax_fn, params = jaxport.convert(lengths, X)
    for x in (X, -X):
      np.testing.assert_allclose(jax_fn(params, x)[0], lengths(x), rtol=2e-6)


def test_errors_raise_as_op_by_op_does():
  @tf.function
  def checked(x):
    kept = tf.boolean_mask(_deep(x), x > 0)
    tf.debugging.assert_less(tf.shape(kept)[0], int((X > 0).sum()) + 1, message="too many positives")
    return _deep(kept)

  jax_fn, params = jaxport.convert(checked, X)
  np.testing.assert_allclose(jax_fn(params, X)[0], checked(X), rtol=2e-6)
  with pytest.raises(Exception, match="too many positives"):
    jax_fn(params, np.abs(X) + 0.1)
