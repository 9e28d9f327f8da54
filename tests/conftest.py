"""Test-wide settings, applied before TensorFlow is imported."""
import os

# TF uses oneDNN only on some CPUs by default; without it, TF refuses NCHW convolutions and pooling on the
# CPU, which the oracle needs. Pin it so the suite behaves the same on every machine.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
