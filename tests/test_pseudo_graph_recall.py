"""engine/pseudo_graph_recall.py: the recall of a pseudo graph's neighbours on a sample of rows, and the FedGL
server logging it each round (``self_supervision.recall_sample``)."""

from __future__ import annotations

import pytest
import structlog
import torch
from structlog.testing import capture_logs

from fedgl_secure.data.benchmarks.synthetic import synthetic_consortium
from fedgl_secure.engine.config import build_config
from fedgl_secure.engine.pseudo_graph import discover_pseudo_graph
from fedgl_secure.engine.pseudo_graph_recall import cosine_rank_scores, recall_rows, sampled_recall
from fedgl_secure.simulation.experiment import run_experiment


@pytest.fixture(scope="module")
def embeddings() -> torch.Tensor:
    return torch.randn(600, 8, generator=torch.Generator().manual_seed(3))


def test_recall_rows_are_distinct_sorted_seeded_and_capped():
    rows = recall_rows(1000, 50, seed=7)
    assert rows.shape == (50,) and torch.equal(rows, rows.unique()) and torch.equal(rows, recall_rows(1000, 50, 7))
    assert not torch.equal(rows, recall_rows(1000, 50, 8))
    assert torch.equal(recall_rows(30, 50, 7), torch.arange(30))


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
def test_the_exact_graph_has_recall_one_and_a_half_wrong_one_half(embeddings, similarity):
    graph = discover_pseudo_graph(embeddings, 10, similarity=similarity, backend="torch")
    rows = recall_rows(600, 40, seed=1)
    found = graph.neighbors[rows].long()
    assert sampled_recall(embeddings, similarity, rows, found) == (1.0, 1.0)
    # each row's 5 best kept, its 5 others replaced by its 5 worst: half of the exact top-10 is lost
    points = torch.nn.functional.normalize(embeddings, dim=1) if similarity == "cosine" else embeddings
    scores = points[rows] @ points.t()
    scores[torch.arange(40), rows] = float("inf")  # never pick the row itself as a worst one
    worst = torch.topk(scores, 5, dim=1, largest=False).indices
    recall, ties = sampled_recall(embeddings, similarity, rows, torch.cat([found[:, :5], worst], dim=1))
    assert recall == pytest.approx(0.5) and ties == pytest.approx(0.5)


def test_a_neighbour_tying_the_last_exact_one_counts_for_recall_ties_only():
    # row 0 has two neighbours at the same similarity (rows 1 and 2); exact top-1 lists one of them
    points = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [-1.0, 0.0]])
    rows = torch.tensor([0])
    recall_1, ties_1 = sampled_recall(points, "dot", rows, torch.tensor([[1]]))
    recall_2, ties_2 = sampled_recall(points, "dot", rows, torch.tensor([[2]]))
    assert ties_1 == ties_2 == 1.0 and sorted([recall_1, recall_2]) == [0.0, 1.0]
    assert sampled_recall(points, "dot", rows, torch.tensor([[3]])) == (0.0, 0.0)


def test_the_fedgl_server_logs_its_pseudo_graphs_recall_each_round():
    config = build_config(
        {
            "method": "fedgl",
            "device": "cpu",
            "federation": {"max_rounds": 2},
            "self_supervision": {"recall_sample": 40, "neighbors": 5, "backend": "torch"},
        }
    )
    structlog.reset_defaults()  # a CLI test on this worker may have filtered info events out
    with capture_logs() as logs:
        run_experiment(config, synthetic_consortium(seed=0), progress=False)
    discovered = [entry for entry in logs if entry["event"] == "pseudo_graph.discovered"]
    assert len(discovered) == 2
    assert all(entry["recall"] == entry["recall_ties"] == 1.0 for entry in discovered)  # exact search, no ties
    assert all(entry["recall_sample"] == 40 for entry in discovered)


def test_cosine_ranks_rows_closer_than_float64_cosines_resolve():
    """Three rows 1e-9, 2e-9 and 3e-9 radians from the first all have float64 cosine 1.0 with it; ranked by the
    distance between unit rows, keeping the two nearest is right and keeping the farthest is not even a tie."""
    angles = torch.tensor([0.0, 3e-9, 1e-9, 2e-9], dtype=torch.float64)
    rows = torch.stack([angles.cos(), angles.sin()], dim=1) * torch.tensor([[1.0], [2.0], [0.5], [3.0]])
    assert (torch.nn.functional.normalize(rows, dim=1)[1:] @ torch.nn.functional.normalize(rows, dim=1)[0] == 1).all()
    first = torch.tensor([0])
    assert sampled_recall(rows, "cosine", first, torch.tensor([[2, 3]])) == (1.0, 1.0)
    assert sampled_recall(rows, "cosine", first, torch.tensor([[1, 3]])) == (0.5, 0.5)


def test_a_zero_row_scores_like_a_cosine_of_zero():
    rows = torch.tensor([[1.0, 0.0], [0.0, 0.0], [-1.0, 0.1], [0.0, 1.0]], dtype=torch.float64)
    unit = torch.nn.functional.normalize(rows, dim=1)
    scores = cosine_rank_scores(unit[:1], unit)
    assert scores[0, 1] == -2.0  # a zero row, like the orthogonal one
    assert scores[0, 3] == pytest.approx(-2.0)
    assert scores[0, 2] < -2.01 and scores[0, 0] == 0.0
    assert (cosine_rank_scores(torch.zeros(1, 2, dtype=torch.float64), unit) == -2.0).all()


def test_rows_of_one_direction_tie_whatever_their_lengths():
    """Quantised embeddings share directions by the thousand: rows (2, -3)·k/8 all have cosine 1 with each other, though
    their unit rows differ by float64 rounding; any s of them is an exact top-s."""
    rows = torch.tensor([[2.0, -3.0], [0.25, -0.375], [0.75, -1.125], [1.625, -2.4375], [1.0, -1.5], [3.0, 1.0]])
    first = torch.tensor([0])
    for kept in ([1, 2], [2, 3], [3, 4], [1, 4]):
        assert sampled_recall(rows, "cosine", first, torch.tensor([kept]))[1] == 1.0
    assert sampled_recall(rows, "cosine", first, torch.tensor([[1, 5]]))[1] == 0.5
