"""Op rules: random number generation from the `rng` key."""
