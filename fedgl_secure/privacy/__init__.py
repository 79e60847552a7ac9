"""Privacy: policy files, DP mechanisms and accounting (Opacus), empirical attacks."""
