"""A corpus of TF-Agents 0.19 programs: policies' action and distribution steps (DQN's Q policy,
a PPO/SAC-style actor policy, its greedy mode, an RNN actor with policy state), DDPG's networks, and
agents' training steps (`agent.train` on a batch of trajectories: DQN, categorical DQN, PPO-clip, and
SAC and TD3, whose steps sample actions and target noise with TF's seeded stateful random ops, so they
convert with `tf_random_streams` and draw TF's numbers). A training step's check is its loss and every
variable it assigns (networks, target networks, optimizer slots, PPO's normalizers).

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
  from tf_agents.agents.categorical_dqn import categorical_dqn_agent
  from tf_agents.agents.ddpg import actor_network, critic_network
  from tf_agents.agents.dqn import dqn_agent
  from tf_agents.agents.ppo import ppo_clip_agent
  from tf_agents.agents.sac import sac_agent, tanh_normal_projection_network
  from tf_agents.agents.td3 import td3_agent
  from tf_agents.networks import (actor_distribution_network, actor_distribution_rnn_network, categorical_q_network,
                                  q_network, value_network)
  from tf_agents.policies import actor_policy, greedy_policy, q_policy
  from tf_agents.specs import tensor_spec
  from tf_agents.trajectories import time_step as ts, trajectory
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


# --- Training steps ------------------------------------------------------------------------------
STEPS = 2   # trajectories of two time steps: one transition per batch entry


def _trajectories(action_spec, steps=STEPS, policy_info=()):
  rng = np.random.RandomState(3)
  obs = rng.normal(size=(BATCH, steps, OBS)).astype(np.float32)
  if action_spec.dtype.is_integer:
    actions = rng.randint(0, 3, size=(BATCH, steps)).astype(np.int32)
  else:
    actions = rng.uniform(-1, 1, size=(BATCH, steps, 2)).astype(np.float32)
  rewards = rng.normal(size=(BATCH, steps)).astype(np.float32)

  def batch(obs, actions, rewards):
    mid = tf.ones(tf.shape(rewards), tf.int32)   # StepType.MID
    return trajectory.Trajectory(step_type=mid, observation=obs, action=actions, policy_info=policy_info,
                                 next_step_type=mid, reward=rewards, discount=tf.ones_like(rewards))
  return batch, (obs, actions, rewards)


def _train_step(agent, action_spec, **kwargs):
  agent.initialize()
  batch, args = _trajectories(action_spec, **kwargs)
  return (lambda *a: agent.train(batch(*a)).loss), args


def _adam():
  return keras.optimizers.Adam(1e-2)


def _seeded():
  keras.utils.set_random_seed(0)   # Keras' initializers, and TF's global seed for the agents' draws
  tf.random.set_seed(0)


TRAIN = dict(grad=False, variables_changed=True)


def dqn_train():
  _seeded()
  net = q_network.QNetwork(OBS_SPEC, DISCRETE, fc_layer_params=(16,))
  fn, args = _train_step(dqn_agent.DqnAgent(TIME_STEP_SPEC, DISCRETE, q_network=net, optimizer=_adam()), DISCRETE)
  return fn, args, TRAIN


def categorical_dqn_train():
  _seeded()
  net = categorical_q_network.CategoricalQNetwork(OBS_SPEC, DISCRETE, num_atoms=11, fc_layer_params=(16,))
  agent = categorical_dqn_agent.CategoricalDqnAgent(TIME_STEP_SPEC, DISCRETE, categorical_q_network=net,
                                                    optimizer=_adam())
  fn, args = _train_step(agent, DISCRETE)
  return fn, args, TRAIN


def ppo_train():
  _seeded()
  actor = actor_distribution_network.ActorDistributionNetwork(OBS_SPEC, CONTINUOUS, fc_layer_params=(16,))
  value = value_network.ValueNetwork(OBS_SPEC, fc_layer_params=(16,))
  agent = ppo_clip_agent.PPOClipAgent(TIME_STEP_SPEC, CONTINUOUS, optimizer=_adam(), actor_net=actor,
                                      value_net=value, num_epochs=2, normalize_observations=True,
                                      normalize_rewards=True)
  info = {"dist_params": {"loc": tf.zeros((BATCH, 3, 2)), "scale": tf.ones((BATCH, 3, 2))}}
  fn, args = _train_step(agent, CONTINUOUS, steps=3, policy_info=info)
  return fn, args, TRAIN


def _critic():
  return critic_network.CriticNetwork((OBS_SPEC, CONTINUOUS), joint_fc_layer_params=(16,))


def sac_train():
  _seeded()
  actor = actor_distribution_network.ActorDistributionNetwork(
      OBS_SPEC, CONTINUOUS, fc_layer_params=(16,),
      continuous_projection_net=tanh_normal_projection_network.TanhNormalProjectionNetwork)
  agent = sac_agent.SacAgent(TIME_STEP_SPEC, CONTINUOUS, actor_network=actor, critic_network=_critic(),
                             actor_optimizer=_adam(), critic_optimizer=_adam(), alpha_optimizer=_adam())
  fn, args = _train_step(agent, CONTINUOUS)
  return fn, args, dict(TRAIN, config={"tf_random_streams": True})


def td3_train():
  _seeded()
  actor = actor_network.ActorNetwork(OBS_SPEC, CONTINUOUS, fc_layer_params=(16,))
  agent = td3_agent.Td3Agent(TIME_STEP_SPEC, CONTINUOUS, actor_network=actor, critic_network=_critic(),
                             actor_optimizer=_adam(), critic_optimizer=_adam(), actor_update_period=1)
  fn, args = _train_step(agent, CONTINUOUS)
  return fn, args, dict(TRAIN, config={"tf_random_streams": True})


CORPUS = {f.__name__: f for f in [
    dqn_q_policy, actor_policy_continuous, greedy_actor_policy, rnn_actor_policy, ddpg_networks,
    dqn_train, categorical_dqn_train, ppo_train, sac_train, td3_train]}
IN_CI = ["dqn_q_policy", "actor_policy_continuous", "rnn_actor_policy", "dqn_train", "sac_train"]


@pytest.mark.slow
@pytest.mark.parametrize("program", sampled(CORPUS.items(), in_ci=IN_CI))
def test_tf_agents_program_matches_tf(program):
  fn, args, options = program()
  check_program(program.__name__, "TF-Agents", fn, *args, **options)
