"""A corpus of TF-Agents 0.19 programs: policies' action and distribution steps (DQN's Q policy,
a PPO/SAC-style actor policy, its greedy mode, an RNN actor with policy state) and DDPG's networks.

TF-Agents is written for Keras 2: its networks are built with `tf.keras` routed to tf_keras (what
`TF_USE_LEGACY_KERAS=1` does for a whole process). Each converts, matches TF eager and under
`jax.jit`, and takes `jax.grad` against `tf.GradientTape` where the outputs are float.
"""
import numpy as np
import pytest
import tensorflow as tf

from corpus_support import sampled
from library_corpus import check_program, legacy_tf_keras

with legacy_tf_keras():
  tf_agents = pytest.importorskip("tf_agents", reason="tf-agents==0.19 is not installed")
  from tf_agents.agents.ddpg import actor_network, critic_network
  from tf_agents.networks import actor_distribution_network, actor_distribution_rnn_network, q_network
  from tf_agents.policies import actor_policy, greedy_policy, q_policy
  from tf_agents.specs import tensor_spec
  from tf_agents.trajectories import time_step as ts
  import tf_keras as keras

# AutoGraph's copies of TF-Agents' `x is ()` tests warn when compiled.
pytestmark = pytest.mark.filterwarnings("ignore:.*with a literal:SyntaxWarning")
BATCH, OBS = 4, 5
OBS_SPEC = tensor_spec.TensorSpec((OBS,), tf.float32)
TIME_STEP_SPEC = ts.time_step_spec(OBS_SPEC)
DISCRETE = tensor_spec.BoundedTensorSpec((), tf.int32, 0, 2)
CONTINUOUS = tensor_spec.BoundedTensorSpec((2,), tf.float32, -1.0, 1.0)


@pytest.fixture(autouse=True)
def _keras2():
  with legacy_tf_keras():
    yield


def _obs(seed=0):
  return np.random.RandomState(seed).normal(size=(BATCH, OBS)).astype(np.float32)


def _first_step(obs):
  return ts.restart(obs, batch_size=BATCH)


def _created(network):
  keras.utils.set_random_seed(0)
  network.create_variables()
  return network


def dqn_q_policy():
  net = _created(q_network.QNetwork(OBS_SPEC, DISCRETE, fc_layer_params=(16, 16)))
  policy = q_policy.QPolicy(TIME_STEP_SPEC, DISCRETE, q_network=net)

  greedy = greedy_policy.GreedyPolicy(policy)

  def fn(obs):
    step = _first_step(obs)
    return greedy.action(step).action, policy.distribution(step).action.logits
  return fn, (_obs(),), {}


def actor_policy_continuous():
  net = _created(actor_distribution_network.ActorDistributionNetwork(OBS_SPEC, CONTINUOUS, fc_layer_params=(16,)))
  policy = actor_policy.ActorPolicy(TIME_STEP_SPEC, CONTINUOUS, actor_network=net)

  def fn(obs):
    dist = policy.distribution(_first_step(obs)).action
    return dist.mean(), dist.stddev(), dist.log_prob(tf.zeros((BATCH, 2)))
  return fn, (_obs(),), {}


def greedy_actor_policy():
  net = _created(actor_distribution_network.ActorDistributionNetwork(OBS_SPEC, CONTINUOUS, fc_layer_params=(16,)))
  policy = greedy_policy.GreedyPolicy(actor_policy.ActorPolicy(TIME_STEP_SPEC, CONTINUOUS, actor_network=net))
  return lambda obs: policy.action(_first_step(obs)).action, (_obs(),), {}


def rnn_actor_policy():
  # A continuous action: TF-Agents' categorical projection calls int() on a 1-element array, which
  # NumPy 2 refuses (a TF-Agents 0.19 / NumPy 2 incompatibility, before any conversion).
  net = _created(actor_distribution_rnn_network.ActorDistributionRnnNetwork(
      OBS_SPEC, CONTINUOUS, input_fc_layer_params=(8,), lstm_size=(8,), output_fc_layer_params=(8,)))
  policy = actor_policy.ActorPolicy(TIME_STEP_SPEC, CONTINUOUS, actor_network=net)
  initial = policy.get_initial_state(BATCH)
  rng = np.random.RandomState(1)
  state = [rng.normal(size=s.shape).astype(np.float32) for s in tf.nest.flatten(initial)]

  def fn(obs, *state):   # the policy state's leaves as arguments
    step = ts.transition(obs, reward=tf.zeros(BATCH), discount=tf.ones(BATCH))
    out = policy.distribution(step, tf.nest.pack_sequence_as(initial, list(state)))
    return out.action.mean(), out.action.stddev(), out.state
  return fn, (_obs(), *state), {}


def ddpg_networks():
  actor = _created(actor_network.ActorNetwork(OBS_SPEC, CONTINUOUS, fc_layer_params=(16,)))
  critic = critic_network.CriticNetwork((OBS_SPEC, CONTINUOUS), joint_fc_layer_params=(16,))
  critic.create_variables()

  def fn(obs):
    action, _ = actor(obs, step_type=(), network_state=())
    q, _ = critic((obs, action), step_type=(), network_state=())
    return action, q
  return fn, (_obs(),), {}


CORPUS = {f.__name__: f for f in [
    dqn_q_policy, actor_policy_continuous, greedy_actor_policy, rnn_actor_policy, ddpg_networks]}
IN_CI = ["dqn_q_policy", "actor_policy_continuous", "rnn_actor_policy"]


@pytest.mark.slow
@pytest.mark.parametrize("program", sampled(CORPUS.items(), in_ci=IN_CI))
def test_tf_agents_program_matches_tf(program):
  fn, args, options = program()
  check_program(program.__name__, "TF-Agents", fn, *args, **options)
