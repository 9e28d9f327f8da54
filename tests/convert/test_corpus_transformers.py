"""A corpus of Hugging Face transformers 4.x TF models with value-dependent shapes: Longformer (local
attention only, with global attention, and a length that is not a multiple of the attention window) and
LED (TFLEDModel and TFLEDForConditionalGeneration), built from tiny configs with random weights.

Their sliding-window attention computes global-attention indices with `tf.where` and `tf.range` of a
count reduced from the mask, so shapes depend on input values: each program converts, matches TF eagerly
(outputs and `jax.grad` against `tf.GradientTape`), and under `jax.jit` raises `DynamicShapeError` naming
the node and the way out (`library_corpus.check_eager_program`).
"""
import os

import numpy as np
import pytest
import tensorflow as tf   # first: TF reads TF_USE_LEGACY_KERAS on import, so tf.keras stays Keras 3

# transformers' TF models need Keras 2 (tf_keras); transformers reads this when its TF modules load, below.
_KERAS_ENV = os.environ.get("TF_USE_LEGACY_KERAS")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
transformers = pytest.importorskip("transformers", minversion="4.0")
if int(transformers.__version__.split(".")[0]) != 4:
  pytest.skip(f"transformers 4.x (TF models) needed, found {transformers.__version__}: see the Makefile",
              allow_module_level=True)
from transformers import (LEDConfig, LongformerConfig, TFLEDForConditionalGeneration, TFLEDModel,  # noqa: E402
                          TFLongformerModel)
if _KERAS_ENV is None:   # transformers set it again on import: later subprocesses get Keras 3 back
  os.environ.pop("TF_USE_LEGACY_KERAS", None)

from corpus_support import sampled  # noqa: E402
from library_corpus import check_eager_program  # noqa: E402

IN_CI = ["longformer_global", "led_generation"]
BATCH, WINDOW = 2, 4
pytestmark = pytest.mark.filterwarnings("ignore:The initializer TruncatedNormal is unseeded")


def _perturbed(model, fn, args):
  """`fn` after building `model` and moving every weight off its init (zero biases, unit LayerNorm
  scales and weights an unseeded initializer repeats would hide a mixed-up operand)."""
  fn(*args)
  rng = np.random.RandomState(0)
  for v in model.weights:
    v.assign(v.numpy() + rng.normal(scale=0.05, size=v.shape).astype(v.dtype.as_numpy_dtype))
  return fn


def _inputs(length, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(3, 50, size=(BATCH, length)).astype(np.int32)
  mask = np.ones((BATCH, length), np.int32)
  mask[1, -2:] = 0                 # the second row is padded
  global_mask = np.zeros((BATCH, length), np.int32)
  global_mask[:, 0] = 1            # a CLS-like first token attends globally
  global_mask[0, 3] = 1            # rows differ in their number of global tokens
  return ids, mask, global_mask


def _longformer():
  tf.random.set_seed(0)   # the initial weights (conftest resets the seed after each test)
  config = LongformerConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, attention_window=WINDOW, max_position_embeddings=40,
                            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  model = TFLongformerModel(config)

  def fn(ids, mask, global_mask=None):
    out = model(input_ids=ids, attention_mask=mask, global_attention_mask=global_mask, training=False)
    return out.last_hidden_state, out.pooler_output
  return model, fn


def longformer():
  model, fn = _longformer()
  args = _inputs(2 * WINDOW)[:2]
  return _perturbed(model, fn, args), args


def longformer_global():
  model, fn = _longformer()
  args = _inputs(2 * WINDOW)
  return _perturbed(model, fn, args), args


def longformer_unaligned_length():   # 7 tokens: padded to the window (8) inside the model, cut after
  model, fn = _longformer()
  args = _inputs(2 * WINDOW - 1)
  return _perturbed(model, fn, args), args


def _led_config():
  tf.random.set_seed(0)
  return LEDConfig(vocab_size=50, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                   decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, attention_window=WINDOW,
                   max_encoder_position_embeddings=32, max_decoder_position_embeddings=32, dropout=0.0,
                   attention_dropout=0.0, activation_dropout=0.0)


def led():
  model = TFLEDModel(_led_config())

  def fn(ids, mask, decoder_ids, global_mask):
    out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                global_attention_mask=global_mask, training=False)
    return out.last_hidden_state, out.encoder_last_hidden_state
  ids, mask, global_mask = _inputs(2 * WINDOW)
  decoder_ids = np.random.RandomState(1).randint(3, 50, size=(BATCH, 5)).astype(np.int32)
  args = (ids, mask, decoder_ids, global_mask)
  return _perturbed(model, fn, args), args


def led_generation():
  model = TFLEDForConditionalGeneration(_led_config())

  def fn(ids, mask, decoder_ids, global_mask):
    return model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                 global_attention_mask=global_mask, training=False).logits
  ids, mask, global_mask = _inputs(2 * WINDOW - 1)
  decoder_ids = np.random.RandomState(1).randint(3, 50, size=(BATCH, 5)).astype(np.int32)
  args = (ids, mask, decoder_ids, global_mask)
  return _perturbed(model, fn, args), args


CORPUS = {f.__name__: f for f in (longformer, longformer_global, longformer_unaligned_length, led, led_generation)}


@pytest.mark.slow
@pytest.mark.parametrize("program", sampled(CORPUS.items(), in_ci=IN_CI))
def test_transformers_program_matches_tf_eagerly_and_names_the_node_under_jit(program, request):
  name = request.node.callspec.id
  fn, args = program()
  _, _, error = check_eager_program(name, "transformers", fn, *args)
  assert "attn" in error.node or "attention" in error.node, error.node   # the sliding-window attention
