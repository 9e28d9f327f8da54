"""While loops with constant trip counts: found from the graph, once, without running the loop."""
import jax
import numpy as np
import pytest
import tensorflow as tf

import jaxport
from jaxport.convert import interpreter
from jaxport.convert.ops import control_flow
from oracle import check


@pytest.fixture
def count_runs(monkeypatch):
  """Counts how many times any graph function is interpreted (loop bodies included)."""
  calls = []
  real = interpreter.run_function

  def counting(fn, args, runtime):
    calls.append(fn.name)
    return real(fn, args, runtime)
  monkeypatch.setattr(control_flow, "run_function", counting)
  return calls


def test_a_million_constant_trips_cost_graph_size_not_trip_count(count_runs):
  fn = lambda x: tf.while_loop(lambda i, x: i < 1_000_000, lambda i, x: (i + 1, x + 1.0), [0, x])[1]  # noqa: E731
  jax_fn, params = jaxport.convert(fn, np.float32(0.5))
  for _ in range(2):
    assert float(jax_fn(params, np.float32(0.5))[0]) == 1_000_000.5
  assert len(count_runs) < 20, f"the loop was simulated: {len(count_runs)} interpretations"
  grad = jax.grad(lambda x: jax_fn(params, x)[0])(np.float32(0.5))   # a static count: reverse mode works
  assert float(grad) == 1.0


@pytest.mark.parametrize("cond, step, start", [
    (lambda i: i < 7, 2, 0), (lambda i: i <= 7, 2, 1), (lambda i: i > -5, -3, 4),
    (lambda i: i >= 0, -1, 6), (lambda i: i != 12, 3, 0), (lambda i: 10 > i, 1, 3), (lambda i: i < 3, 1, 9)],
    ids=["lt", "le", "gt", "ge", "ne", "flipped", "zero-trips"])
def test_closed_form_counts_match_tf(cond, step, start, count_runs):
  def fn(x):
    return tf.while_loop(lambda i, x: cond(i), lambda i, x: (i + step, x * 1.5 + 1.0), [tf.constant(start), x])[1]
  check(fn, np.float32(0.25), vmap=False)
  assert len(count_runs) < 40


def test_maximum_iterations_and_a_data_dependent_condition():
  def fn(x):
    return tf.while_loop(lambda i, x: x < 100.0, lambda i, x: (i + 1, x * 2.0), [0, x], maximum_iterations=5)[1]
  for x in (np.float32(1.0), np.float32(30.0)):
    check(fn, x, grad=False, vmap=False)
