"""The local model: a two-layer GCN over a (possibly pseudo-graph-fused) normalised adjacency."""
