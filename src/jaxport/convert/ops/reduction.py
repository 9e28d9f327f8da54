"""Op rules: reductions, arg-reductions and cumulative ops."""
