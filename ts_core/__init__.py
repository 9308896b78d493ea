"""tsprobe core."""
