"""Op rules: TensorList (the TensorArray of TF2)."""
