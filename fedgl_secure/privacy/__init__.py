"""Privacy: policy files, DP mechanisms (clipping, secure Gaussian noise, randomised response), accounting with Opacus, empirical attacks."""
