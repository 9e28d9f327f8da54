"""Op rules: shapes, slicing, gathering, scattering and other array plumbing."""
