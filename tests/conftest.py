"""Test-wide settings, applied before TensorFlow is imported."""
import os

# TF uses oneDNN only on some CPUs by default; without it, TF refuses NCHW convolutions and pooling on the
# CPU, which the oracle needs. Pin it so the suite behaves the same on every machine.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _no_global_tf_seed_leaks():
  """A test that calls tf.random.set_seed must not change the seeds of the tests after it in the same
  worker (unseeded ops then take counter-based seeds, e.g. tf.data's unseeded shuffles)."""
  yield
  tf = sys.modules.get("tensorflow")
  if tf is not None:
    tf.random.set_seed(None)


@pytest.fixture
def restore_cli_env(monkeypatch):
  """The `jaxport` commands set TF's log level and the Keras backend; keep that out of other tests."""
  monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
  monkeypatch.setenv("KERAS_BACKEND", os.environ.get("KERAS_BACKEND", "tensorflow"))
