"""A corpus of Sonnet 2 programs: the guide's MLP, a ResNet-50-deep ResNet with BatchNorm in training
mode, LSTM static and dynamic unrolls, a VQ-VAE quantizer with EMA updates, an embedding's training
step with Sonnet's Adam (sparse updates).

Each converts, matches TF eager and under `jax.jit` (assigned variables too: BatchNorm's moving
statistics, the EMA codebook, the optimizer's slots), and takes `jax.grad` against `tf.GradientTape`
(not the training step, whose output is its loss before the update).
"""
import numpy as np
import pytest
import tensorflow as tf

snt = pytest.importorskip("sonnet", reason="dm-sonnet==2.0.2 is not installed")

from corpus_support import sampled  # noqa: E402
from library_corpus import check_program  # noqa: E402

BATCH = 4


def _x(shape, seed=0):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32)


def _built(module, *args, **kwargs):
  """Creates the module's variables (Sonnet builds on first call) with a fixed seed; zero-initialized
  weights (ResNet's logits) get random values, so every layer reaches the outputs and the gradients."""
  tf.random.set_seed(0)
  module(*tf.nest.map_structure(tf.convert_to_tensor, args), **kwargs)
  rng = np.random.RandomState(1)
  for v in module.trainable_variables:
    if v.shape.rank > 1 and not np.any(v.numpy()):
      v.assign(0.1 * rng.normal(size=v.shape).astype(np.float32))
  return module


def mlp():
  """The Sonnet guide's MLP on flattened images."""
  x = _x((BATCH, 28 * 28))
  model = _built(snt.Sequential([snt.Flatten(), snt.nets.MLP([32, 32, 10])]), x)
  return lambda images: tf.nn.log_softmax(model(images)), (x,), {}


def resnet50_batchnorm_training():
  """ResNet-50's depth ([3, 4, 6, 3] bottleneck blocks), narrow channels, BatchNorm in training mode."""
  x = _x((BATCH, 32, 32, 3))
  model = snt.nets.ResNet([3, 4, 6, 3], num_classes=10, channels_per_group_list=(16, 32, 64, 128))
  _built(model, x, is_training=True)
  return lambda images: model(images, is_training=True), (x,), dict(variables_changed=True)


def resnet_batchnorm_eval():
  x = _x((BATCH, 16, 16, 3))
  model = snt.nets.ResNet([1, 1, 1, 1], num_classes=10, channels_per_group_list=(8, 16, 16, 32))
  _built(model, x, is_training=True)
  return lambda images: model(images, is_training=False), (x,), {}


def lstm_static_unroll():
  seq = _x((5, BATCH, 6))
  core = snt.LSTM(8)
  _built(core, seq[0], core.initial_state(BATCH))
  return lambda xs: snt.static_unroll(core, xs, core.initial_state(BATCH)), (seq,), {}


def lstm_dynamic_unroll():
  seq = _x((5, BATCH, 6))
  core = snt.DeepRNN([snt.LSTM(8), snt.GRU(6)])
  _built(core, seq[0], core.initial_state(BATCH))
  return lambda xs: snt.dynamic_unroll(core, xs, core.initial_state(BATCH)), (seq,), {}


def vqvae_ema():
  """A VQ-VAE's encoder, EMA vector quantizer (training: the codebook moves) and decoder."""
  x = _x((BATCH, 8, 8, 3))
  encoder = snt.Conv2D(4, 3, stride=2)
  vq = snt.nets.VectorQuantizerEMA(embedding_dim=4, num_embeddings=16, commitment_cost=0.25, decay=0.9)
  decoder = snt.Conv2DTranspose(3, 3, stride=2)

  def fn(images):
    quantized = vq(encoder(images), is_training=True)
    recon = decoder(quantized["quantize"])
    return recon, quantized["loss"], quantized["perplexity"], quantized["encoding_indices"]
  tf.random.set_seed(0)
  fn(tf.constant(x))
  return fn, (x,), dict(variables_changed=True)


def embed_adam_step():
  """A training step of `snt.Embed` + `snt.Linear` with `snt.optimizers.Adam`: the embedding's sparse
  gradient deduplicated with tf.unique (padded under jit), the slots' rows gathered and scattered."""
  ids = np.array([[3, 5, 3], [5, 5, 1]], np.int32)   # repeated ids
  targets = np.array([[1.0], [-1.0]], np.float32)
  tf.random.set_seed(0)
  embed, head, optimizer = snt.Embed(vocab_size=12, embed_dim=4), snt.Linear(1), snt.optimizers.Adam(0.01)
  embed(ids), head(tf.zeros((1, 12)))   # Sonnet makes its variables on the first call
  variables = embed.trainable_variables + head.trainable_variables

  def step(ids, targets):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(head(tf.reshape(embed(ids), (2, 12))) - targets))
    optimizer.apply(tape.gradient(loss, variables), variables)
    return loss
  step(ids, targets)   # makes the optimizer's slots
  return step, (ids, targets), dict(variables_changed=True, grad=False)


def rnn_adam_step():
  """A training step through `snt.dynamic_unroll` (a tf.while_loop) of an LSTM and a GRU: the tape's
  gradient loop, in the same function, pops what the forward loop's accumulators pushed."""
  seq, targets = _x((5, BATCH, 6)), _x((BATCH, 6), seed=1)
  tf.random.set_seed(0)
  core, optimizer = snt.DeepRNN([snt.LSTM(8), snt.GRU(6)]), snt.optimizers.Adam(0.01)
  _built(core, seq[0], core.initial_state(BATCH))

  def step(xs, targets):
    with tf.GradientTape() as tape:
      outputs, _ = snt.dynamic_unroll(core, xs, core.initial_state(BATCH))
      loss = tf.reduce_mean(tf.square(outputs[-1] - targets))
    optimizer.apply(tape.gradient(loss, core.trainable_variables), core.trainable_variables)
    return loss
  step(seq, targets)   # makes the optimizer's slots
  return step, (seq, targets), dict(variables_changed=True, grad=False)


CORPUS = {f.__name__: f for f in [
    mlp, resnet50_batchnorm_training, resnet_batchnorm_eval, lstm_static_unroll, lstm_dynamic_unroll, vqvae_ema,
    embed_adam_step, rnn_adam_step,
]}
IN_CI = ["mlp", "resnet50_batchnorm_training", "lstm_dynamic_unroll", "vqvae_ema", "embed_adam_step"]


@pytest.mark.slow
@pytest.mark.parametrize("program", sampled(CORPUS.items(), in_ci=IN_CI))
def test_sonnet_program_matches_tf(program):
  fn, args, options = program()
  check_program(program.__name__, "Sonnet", fn, *args, **options)
