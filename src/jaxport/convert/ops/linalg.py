"""Op rules: matrix products."""
