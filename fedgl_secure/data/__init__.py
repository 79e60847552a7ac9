"""Datasets, simulated institutions and the global node index."""
