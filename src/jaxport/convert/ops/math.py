"""Op rules: elementwise math, comparisons, logical ops and casts."""
