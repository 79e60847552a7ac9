"""Upload kinds: the names of what a client sends each round. Every kind is a sum of pre-weighted client terms.

At the bottom of the package, beside :mod:`fedgl_secure.errors`: the policy (which kinds may leave a bank),
the wire and the methods all name them, and none of those should have to import the others (or torch)
for a string.
"""

WEIGHTS = "weights"  # cat(w_k · W_k, [w_k]): flattened parameters, then the weight itself (for Σ_k w_k)
PREDICTIONS = "predictions"  # w_k · P_k in global index (M x C)
EMBEDDINGS = "embeddings"  # w_k · H_k in global index (M x D)
NODE_WEIGHT = "node_weight"  # w_k · [i ∈ V_k] (M), the per-node normaliser of Eqs. 12/14
META_GRADIENTS = "meta_gradients"  # cat(w_k · g_k, [w_k]): a query-loss gradient (GraphFL's meta stage)
