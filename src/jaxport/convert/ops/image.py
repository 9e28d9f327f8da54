"""Op rules: image resizing."""
