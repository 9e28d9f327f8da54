"""Op rules: convolutions, pooling, normalisation, activations, softmax and losses."""
