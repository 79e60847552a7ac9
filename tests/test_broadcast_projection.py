"""Each bank is served only its projection of a broadcast, signed by the aggregator (issue 27, threat-model R14).

DESIGN §5.1: a bank may learn Ȳ and Ā *projected to its own nodes*. The projection must change nothing a bank
computes (Eq. 9 uses Ā^(k), Eq. 8 the pseudo labels of its own nodes) while carrying nothing about other rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedgl_secure.crypto.broadcast_signature import sign_broadcast, verify_broadcast
from fedgl_secure.engine.pseudo_graph import PseudoGraph
from fedgl_secure.engine.pseudo_labels import NO_LABEL
from fedgl_secure.errors import CiphertextError, ReceiptError
from fedgl_secure.methods.base import Broadcast
from fedgl_secure.model.adjacency import project_pseudo_graph
from fedgl_secure.wire import encodings
from fedgl_secure.wire.broadcast import decode_broadcast, encode_broadcast, encode_projection, model_label

M, S, PARAMETERS = 60, 5, 17


def _broadcast(seed: int = 0) -> Broadcast:
    rng = np.random.default_rng(seed)
    neighbors = np.stack([rng.choice(np.delete(np.arange(M), i), S, replace=False) for i in range(M)])
    weights = rng.random((M, S)).astype(np.float32)
    weights /= weights.sum(axis=1, keepdims=True)
    labels = rng.integers(-1, 3, M)
    return Broadcast(
        3,
        torch.from_numpy(rng.normal(size=PARAMETERS).astype(np.float32)),
        torch.from_numpy(labels),
        PseudoGraph(torch.from_numpy(neighbors), torch.from_numpy(weights)),
    )


def test_a_bank_gets_its_rows_only_and_computes_exactly_what_the_whole_broadcast_gives_it():
    broadcast = _broadcast()
    rows = np.random.default_rng(1).permutation(M)[:25]  # the bank's union positions, in its own node order
    served = decode_broadcast(3, encode_projection(broadcast, rows), PARAMETERS, M, S, rows=rows)
    whole = decode_broadcast(3, encode_broadcast(broadcast), PARAMETERS, M, S)
    torch.testing.assert_close(served.weights, whole.weights)
    # Eq. 8: the pseudo labels of its own nodes, none elsewhere
    np.testing.assert_array_equal(served.pseudo_labels.numpy()[rows], whole.pseudo_labels.numpy()[rows])
    others = np.setdiff1d(np.arange(M), rows)
    assert (served.pseudo_labels.numpy()[others] == NO_LABEL).all()
    # Eq. 9: Ā^(k), rows and columns of its nodes, is unchanged
    mine = project_pseudo_graph(served.pseudo_graph.neighbors.numpy(), served.pseudo_graph.weights.numpy(), rows, M)
    full = project_pseudo_graph(whole.pseudo_graph.neighbors.numpy(), whole.pseudo_graph.weights.numpy(), rows, M)
    assert (mine != full).nnz == 0 and full.nnz > 0
    # nothing of another bank's rows, and no edge to a node it does not hold
    assert (served.pseudo_graph.weights.numpy()[others] == 0).all()
    own = np.isin(served.pseudo_graph.neighbors.numpy()[rows], rows)
    assert (served.pseudo_graph.weights.numpy()[rows][~own] == 0).all()
    assert (served.pseudo_graph.neighbors.numpy() != np.arange(M)[:, None]).all()  # never the row itself
    arrays = encodings.decode_arrays(encode_projection(broadcast, rows))
    assert arrays["pseudo_labels"].shape == (25,) and arrays["pseudo_graph_neighbors"].shape == (25, S)
    sent = arrays["pseudo_graph_neighbors"][arrays["pseudo_graph_weights"] > 0]
    assert np.isin(sent, rows).all()


def test_a_projection_for_other_rows_or_malformed_is_refused():
    broadcast = _broadcast()
    rows = np.arange(10, 30)
    data = encode_projection(broadcast, rows)
    with pytest.raises(CiphertextError, match="other union positions than this bank's"):
        decode_broadcast(3, data, PARAMETERS, M, S, rows=np.arange(11, 31))
    with pytest.raises(CiphertextError, match="other union positions than this bank's"):
        decode_broadcast(3, data, PARAMETERS, M, S)  # a reader that does not know its rows
    arrays = encodings.decode_arrays(data)
    arrays["pseudo_labels"] = arrays["pseudo_labels"][:-1]
    with pytest.raises(CiphertextError, match="projected pseudo labels are not 20 values"):
        decode_broadcast(3, encodings.encode_arrays(arrays), PARAMETERS, M, S, rows=rows)
    # W̄ alone (a method without self-supervision) has nothing per node: served whole, read without rows
    plain = Broadcast(2, broadcast.weights)
    assert decode_broadcast(2, encode_projection(plain, rows), PARAMETERS, M, S, rows=rows).pseudo_labels is None


def test_broadcasts_are_signed_for_one_bank_and_label():
    key = Ed25519PrivateKey.generate()
    body = encode_projection(_broadcast(), np.arange(5))
    signature = sign_broadcast(key, "fed", "bank-a", model_label(3), body)
    verify_broadcast(key.public_key(), "fed", "bank-a", model_label(3), body, signature)
    refusals = {
        "altered": ("fed", "bank-a", model_label(3), body + b"x", signature),
        "another bank": ("fed", "bank-b", model_label(3), body, signature),
        "another version": ("fed", "bank-a", model_label(4), body, signature),
        "another federation": ("other", "bank-a", model_label(3), body, signature),
        "not hex": ("fed", "bank-a", model_label(3), body, "zz"),
    }
    for args in refusals.values():
        with pytest.raises(ReceiptError, match="bad signature"):
            verify_broadcast(key.public_key(), *args)
    with pytest.raises(ReceiptError, match="unsigned"):
        verify_broadcast(key.public_key(), "fed", "bank-a", model_label(3), body, None)
    with pytest.raises(ReceiptError, match="bad signature"):
        verify_broadcast(Ed25519PrivateKey.generate().public_key(), "fed", "bank-a", model_label(3), body, signature)
