"""Global pseudo graph (Eq. 15): ``Ā = rownorm(topS(max(H̄ H̄ᵀ, 0)))``.

The server turns the fused embeddings ``H̄`` (``M x D``, one row per node of the global index)
into a kNN-style graph: each node keeps its ``s`` most similar other nodes, negative similarities
become 0, and each row is normalised to sum 1.

``M`` reaches 10^5–10^6 in a consortium, so the ``M x M`` similarity matrix is never built: rows
are processed in blocks and only the top ``s`` entries of each row survive a block. Three
exact backends do the block work:

* ``torch``: ``block @ H̄ᵀ`` and ``torch.topk`` on any device; the only path that uses a GPU;
* ``fused``: a numba kernel (``fused_knn``) that computes each small tile of scores in L1 and
  keeps only those above each row's running s-th best, so no score is written to memory: the
  fastest on a CPU (docs/results/pseudo_graph_100k.json);
* ``faiss``: ``faiss.IndexFlatIP`` exact inner-product search, whose fused matmul + heap
  selection is faster on a CPU than a dense ``topk`` over full rows; the CPU fallback where
  numba is missing.

All give the same graph up to floating-point rounding (and the choice among tied entries).

Exact search is still ``O(M² D)``: 24 s fused (faiss 75 s) at ``M = 10^5`` on 2 cores under
load 4-5, hours at ``2.5·10^6``. For large ``M`` two **approximate** backends trade a little
recall for time; both score every candidate exactly, so only the candidate sets approximate:

* ``faiss_ivf``: faiss' ``IndexIVFFlat`` (``faiss_ivf``) over rows lifted so that L2 order is
  inner-product order (the MIPS reduction; exact for ``dot``), ``4√M`` lists, 64 probed per row,
  plus an exact scan of the 4,096 highest-norm rows for ``dot``. Chosen by measurement over faiss
  HNSW and ``ivf`` (benchmarks/knn_sweep.py, docs/results/knn_sweep.json: recall 0.997-1.0 at
  10^5 rows for both similarities and data kinds, s = 10 and 100); what ``auto`` runs on a CPU;

* ``ivf``: our own inverted file (``approximate_knn``; each row probes its own nearest lists,
  candidates scored by ``probed_knn``'s fused kernel on a CPU, by torch on CUDA); what ``auto``
  runs on a GPU, or on a CPU without faiss. Recall at 2.5·10^6 and 10^7 rows:
  docs/results/pseudo_graph_recall_*.json.

A binary outcome fuses two logits, and for ``H̄`` of two columns ``planar`` (``planar_knn``: arcs of
the angle order for cosine, convex layers for dot) is exact in ``O(M log M)`` plus a few thousand
scores per row.

``auto`` picks exact search up to ``APPROXIMATE_MIN_NODES`` rows (torch on a usable GPU, else
fused from ``FUSED_MIN_NODES`` rows, else faiss) and above it ``planar`` for two columns, else
``faiss_ivf`` on a CPU with faiss, else ``ivf`` (on the GPU when there is one); any backend can
be forced. Below the threshold results stay exact, so small runs (tests, the
consortium-vs-simulation equality) are unaffected. All backends return the same ``PseudoGraph``
structure: ``M x s`` neighbours (never the node itself) and ``rownorm``-ed clamped weights
(``faiss_ivf``, ``planar``: int32 ids while ``M < 2^31``); none holds more than a block (or a
list) of rows' candidates besides that result.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Generator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from fedgl_secure.engine import approximate_knn, faiss_ivf, planar_knn
from fedgl_secure.errors import ConfigError

if TYPE_CHECKING:
    import scipy.sparse as sp

SIMILARITIES = ("dot", "cosine")
BACKENDS = ("auto", "torch", "fused", "faiss", "ivf", "faiss_ivf", "planar")
# Above this many rows ``auto`` leaves the O(M²) exact search (~12 s at 10^5 rows on 2 quiet cores
# with faiss, less fused: docs/results/pseudo_graph_100k.json; ~75 s per round at 2·10^5, tolerable
# for a few hundred rounds; beyond, it dominates a round). Up to here every graph stays exact.
APPROXIMATE_MIN_NODES = 200_000
# On a GPU exact search stays affordable further (the M x M products run at GPU speed); above
# this it switches too. See docs/results/pseudo_graph_cuda.json.
APPROXIMATE_MIN_NODES_CUDA = 2_000_000
# From this many rows ``auto`` runs the fused kernel on a CPU, below it faiss. A process pays
# ~1.5 s once to import numba and load the cached kernel (and 17-33 s where it was never
# compiled); faiss' search of 20,000 rows takes ~1 s, so below this the saving per call is a
# fraction of a second that a short run (tests, small consortia, their service processes) never
# earns back. Forcing ``backend="fused"`` works at any size.
FUSED_MIN_NODES = 20_000

# Bound on one block of similarity scores (float32). A block of rows is the torch backend's
# working set; 256 MB keeps it well inside a GPU and a modest CPU host while blocks stay large
# enough (671 rows at M = 10^5) for the matmul to run at full speed.
_BLOCK_SCORE_BYTES = 256 * 2**20
# A GPU (tens of GB) takes larger blocks: fewer, longer kernels (512 rows per block at M = 10^6).
_BLOCK_SCORE_BYTES_CUDA = 2 * 2**30
# faiss computes distances in tiles (``_faiss_tiles``); a block of rows that is a multiple of the
# tile's queries keeps its BLAS path as efficient as one call over all rows, while bounding the
# (rows x (s+1)) candidate buffers we hold at once.
_FAISS_BLOCK_ROWS = 4 * 4096
# Rows per call of the fused kernel: bounds its (rows x s) results held at once besides the graph,
# and gives the progress bar steps; each call spreads its rows over all threads.
_FUSED_BLOCK_ROWS = 16384
# Blocks of 64 rows handed to numba's threads one at a time (``numba.parallel_chunksize``), so a
# thread slowed by a busy host takes fewer rather than holding up a static half.
_FUSED_CHUNKSIZE = 1
# (queries, database rows) per faiss distance tile; see ``_faiss_tiles``.
_FAISS_TILE = (256, 65536)
_OVERFLOW_MESSAGE = "embeddings: similarities overflow float32; rescale the embeddings or use similarity='cosine'"
# Fewer blocks than this finish quickly enough that a progress bar would only be noise.
_PROGRESS_MIN_BLOCKS = 20


@dataclass(frozen=True)
class PseudoGraph:
    """The global pseudo graph ``Ā`` as a dense ``M x s`` neighbour list.

    Attributes:
        neighbors: ``M x s_eff`` global row indices, int64 (int32 from the approximate
            ``faiss_ivf`` backend while ``M < 2^31``: at 10^7 x 100, 4 GB instead of 8), row ``i`` sorted by decreasing
            similarity to node ``i``; never ``i`` itself.
        weights: ``M x s_eff`` float32 edge weights ``Ā[i, neighbors[i, j]]``; each row sums
            to 1, or is all 0 when node ``i`` has no positive similarity among its top s.
            A zero weight marks a kept neighbour whose similarity was clamped to 0; it is not
            an edge.

    A fixed-width list rather than a sparse matrix because every row has exactly ``s_eff``
    candidates: it is what the server computes, compact to transmit, and cheap to project onto
    one client's nodes.
    """

    neighbors: torch.Tensor
    weights: torch.Tensor

    def __post_init__(self) -> None:
        if self.neighbors.dim() != 2 or self.neighbors.shape != self.weights.shape:
            raise ValueError(
                "PseudoGraph: neighbors and weights must be 2-D with the same shape, got "
                f"{tuple(self.neighbors.shape)} and {tuple(self.weights.shape)}"
            )

    @property
    def num_nodes(self) -> int:
        """``M``, the size of the global index."""
        return int(self.neighbors.shape[0])

    @property
    def num_neighbors(self) -> int:
        """``s_eff = min(s, M - 1)``, the width of each neighbour row."""
        return int(self.neighbors.shape[1])

    def to_sparse_coo(self) -> torch.Tensor:
        """``Ā`` as a coalesced ``M x M`` torch sparse COO tensor (zero weights dropped)."""
        m, width = self.neighbors.shape
        rows = torch.arange(m, dtype=torch.int64).repeat_interleave(width)
        cols = self.neighbors.reshape(-1).to(torch.int64)
        values = self.weights.reshape(-1)
        keep = values != 0
        indices = torch.stack([rows[keep], cols[keep]])
        # Checked: a PseudoGraph may come from outside (e.g. a received broadcast), and an
        # out-of-range index in an unchecked sparse tensor is a crash, not an error.
        return torch.sparse_coo_tensor(indices, values[keep], (m, m), check_invariants=True).coalesce()

    def to_scipy(self) -> sp.csr_matrix:
        """``Ā`` as an ``M x M`` scipy CSR matrix (float32, zero weights dropped)."""
        import scipy.sparse as sp

        coo = self.to_sparse_coo()
        rows, cols = coo.indices().numpy()
        m = self.num_nodes
        return sp.csr_matrix((coo.values().numpy(), (rows, cols)), shape=(m, m))


# --------------------------------------------------------------------------------------------
# The equation, as small pure functions.


def rownorm(weights: torch.Tensor) -> torch.Tensor:
    """Divide each row by its sum (Eq. 15's ``rownorm``); rows summing to 0 stay all 0.

    Inputs are non-negative here, so a zero sum means an all-zero row: such a node has no
    positively similar neighbour and gets no pseudo edges rather than a division by zero.
    """
    totals = weights.sum(dim=1, keepdim=True)
    safe = torch.where(totals > 0, totals, torch.ones_like(totals))
    return torch.where(totals > 0, weights / safe, torch.zeros_like(weights))


def top_s(scores: torch.Tensor, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 15's ``topS``: the ``s`` largest entries of each row, as ``(values, column ids)``.

    Sorted by decreasing value. The caller excludes self-similarity beforehand (by setting it
    to ``-inf``), so this stays a plain selection.
    """
    return torch.topk(scores, s, dim=1, largest=True, sorted=True)


def pseudo_graph_weights(top_similarities: torch.Tensor) -> torch.Tensor:
    """Eq. 15 on the kept entries: ``rownorm(max(·, 0))`` of each row's top-s similarities.

    ``max(·, 0)`` is monotone, so selecting the top s *before* clamping keeps the same values
    as clamping the full ``M x M`` matrix first (up to which tied zeros are listed, and those
    carry weight 0 either way). That order is what lets us never build the full matrix.
    """
    return rownorm(top_similarities.clamp(min=0))


def drop_self(ids: torch.Tensor, scores: torch.Tensor, row_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Remove each row's own id from its ``s + 1`` nearest candidates, leaving ``s`` columns.

    A search over all nodes finds the query itself among its candidates, usually but not
    always: with ``dot`` a node's self-similarity ``‖h_i‖²`` need not be among its top
    ``s + 1``, and ties can push it out. Then the first ``s`` candidates already are the top
    ``s`` of the other nodes, so the last column is the one to drop.
    """
    rows, width = ids.shape
    is_self = ids == row_ids[:, None]
    # Column to drop: the first self match, else the last. A gather over "every column but that
    # one" keeps the order and the width fixed even for malformed rows, and is ~3x faster than
    # boolean-mask indexing at 10^5 x 101.
    drop = torch.where(is_self.any(dim=1), is_self.to(torch.uint8).argmax(dim=1), width - 1)
    columns = torch.arange(width - 1).expand(rows, width - 1)
    columns = columns + (columns >= drop[:, None])
    return ids.gather(1, columns), scores.gather(1, columns)


# --------------------------------------------------------------------------------------------
# Discovery.


def discover_pseudo_graph(
    embeddings: torch.Tensor,
    s: int,
    similarity: str = "dot",
    backend: str = "auto",
    block_size: int | None = None,
    device: torch.device | str | None = None,
    progress: bool | None = None,
) -> PseudoGraph:
    """Compute the global pseudo graph ``Ā = rownorm(topS(max(H̄ H̄ᵀ, 0)))`` (Eq. 15).

    Args:
        embeddings: ``H̄``, ``M x D`` fused node embeddings (any real dtype; used as float32, ranked
            in the float64 they are promoted to by ``planar``).
        s: neighbours kept per node; ``s_eff = min(s, M - 1)`` because a node is never its own
            neighbour.
        similarity: ``"dot"`` (the paper's ``H̄ H̄ᵀ``) or ``"cosine"`` (rows L2-normalised first,
            zero rows stay zero), which avoids a few high-norm nodes becoming everybody's
            neighbours (DESIGN §3, pitfalls).
        backend: ``"torch"`` (exact, any device), ``"fused"`` and ``"faiss"`` (exact, CPU only),
            ``"faiss_ivf"`` (approximate, CPU only; ``faiss_ivf``), ``"ivf"`` (approximate, any
            device; ``approximate_knn``), ``"planar"`` (exact, CPU only, 2 columns; ``planar_knn``)
            or ``"auto"``: exact up to ``APPROXIMATE_MIN_NODES`` rows (``APPROXIMATE_MIN_NODES_CUDA``
            on a GPU), above it ``planar`` for 2 columns, else ``faiss_ivf`` on a CPU with faiss,
            else ``ivf``; exact means torch on a usable GPU, else fused from
            ``FUSED_MIN_NODES`` rows when numba imports, else faiss when installed, else torch.
            The first fused call in a fresh installation compiles its kernel (17-33 s on 2 busy
            cores); later processes load it from numba's on-disk cache (~1.5 s).
        block_size: rows processed per block by the exact backends; by default as many as keep
            one block of scores within ~256 MB (torch on a CPU; 2 GB on a GPU) or 16384 (fused,
            faiss).
        device: where the torch and ivf backends compute; a CPU device makes ``auto`` prefer
            fused (from ``FUSED_MIN_NODES`` rows) or faiss. Results always come back on the CPU.
        progress: show a progress bar over blocks (lists, for ivf); ``None`` shows one only for
            more than 20.

    Raises:
        ConfigError: an argument is invalid (the message names it).
    """
    if similarity not in SIMILARITIES:
        raise ConfigError(f"similarity must be one of {SIMILARITIES}, got {similarity!r}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
    s = _positive_int("s", s)
    if block_size is not None:
        block_size = _positive_int("block_size", block_size)
    h = _validated_embeddings(embeddings)
    m = h.shape[0]
    chosen, target = resolve_backend(backend, device, num_nodes=m, num_dims=h.shape[1])

    s_eff = min(s, m - 1)
    if s_eff <= 0:  # zero or one node: nobody to connect to
        empty = torch.empty((m, 0))
        return PseudoGraph(empty.to(torch.int64), empty.to(torch.float32))
    if similarity == "cosine":
        h = torch.nn.functional.normalize(h, p=2.0, dim=1)

    if chosen == "fused":
        bounds = _block_bounds(m, block_size or _FUSED_BLOCK_ROWS)
        blocks, steps = _fused_top_s(h.cpu().contiguous(), s_eff, bounds), len(bounds)
    elif chosen == "faiss":
        # A short last block would fall below faiss' BLAS threshold onto its ~2x slower
        # one-query-at-a-time path, so the default blocking folds it into the previous block.
        bounds = _block_bounds(m, block_size or _FAISS_BLOCK_ROWS, fold_short_tail=block_size is None)
        blocks, steps = _faiss_top_s(h.cpu().contiguous(), s_eff, bounds), len(bounds)
    elif chosen == "faiss_ivf":
        bounds = _block_bounds(m, block_size or _FUSED_BLOCK_ROWS)
        show_build = m > _PROGRESS_MIN_BLOCKS * _FUSED_BLOCK_ROWS if progress is None else progress
        blocks, steps = (
            _faiss_ivf_top_s(h.cpu().contiguous(), s_eff, similarity == "dot", bounds, show_build),
            len(bounds),
        )
    elif chosen == "planar":
        # ranked in float64 (an overflow of the float32 similarities is caught below, as for every backend)
        steps, found = planar_knn.planar_top_s(embeddings.detach().cpu(), s_eff, similarity)
        blocks = ((b, *drop_self(ids, top, b)) for b, ids, top in found)
    elif chosen == "ivf":
        _check_no_overflow(h)
        threads = torch.get_num_threads()
        ids, top = approximate_knn.approximate_top_s(
            h.to(target),
            s_eff,
            mips=similarity == "dot",
            kernel_context=lambda: _numba_threads(threads),
            progress=m > 10 * _PROGRESS_MIN_BLOCKS * _FUSED_BLOCK_ROWS if progress is None else progress,
        )
        return _graph_in_place(ids, top)
    else:
        budget = _BLOCK_SCORE_BYTES_CUDA if target.type == "cuda" else _BLOCK_SCORE_BYTES
        bounds = _block_bounds(m, block_size or max(1, budget // (4 * m)))
        blocks, steps = _torch_top_s(h.to(target), s_eff, bounds), len(bounds)

    large = chosen in ("faiss_ivf", "planar")
    neighbors = torch.empty((m, s_eff), dtype=neighbor_dtype(m) if large else torch.int64)
    weights = torch.empty((m, s_eff), dtype=torch.float32)
    show = steps > _PROGRESS_MIN_BLOCKS if progress is None else progress
    # closing(): an error mid-way must still run the generator's cleanup (faiss thread count).
    with closing(blocks), tqdm(total=steps, desc="pseudo graph", unit="block", disable=not show) as bar:
        for rows, ids, top in blocks:
            if not torch.isfinite(top).all():
                raise ConfigError(_OVERFLOW_MESSAGE)
            rows = rows.cpu() if isinstance(rows, torch.Tensor) else rows
            neighbors[rows] = ids.to(device="cpu", dtype=neighbors.dtype)
            weights[rows] = pseudo_graph_weights(top).cpu()
            bar.update(1)
    return PseudoGraph(neighbors, weights)


def _graph_in_place(ids: torch.Tensor, top: torch.Tensor) -> PseudoGraph:
    """The graph from full ``M x s`` top-s lists, weights computed over ``top`` in place, block by
    block: at 10^7 rows and s = 100 the lists are 12 GB, too much to hold twice."""
    for start in range(0, top.shape[0], _FAISS_BLOCK_ROWS):
        block = top[start : start + _FAISS_BLOCK_ROWS]
        if not torch.isfinite(block).all():
            raise ConfigError(_OVERFLOW_MESSAGE)
        block.copy_(pseudo_graph_weights(block))
    return PseudoGraph(ids, top)


def neighbor_dtype(m: int) -> torch.dtype:
    """Neighbour ids of the approximate backends: int32 while ``M`` fits it, int64 beyond.

    They serve the large ``M``, where ids dominate memory: 10^7 x 100 int64 ids alone are 8 GB.
    Every consumer indexes with them (numpy, torch) or casts them (``to_sparse_coo``, the wire).
    """
    return torch.int32 if m < 2**31 else torch.int64


def _faiss_ivf_top_s(
    h: torch.Tensor, s: int, mips: bool, bounds: list[tuple[int, int]], progress: bool
) -> Generator[tuple[slice, torch.Tensor, torch.Tensor], None, None]:
    """Yield ``(rows, ids, similarities)`` of each block's approximate top s via faiss' inverted file
    over lifted rows (``faiss_ivf``), similarities exact."""
    faiss = _import_faiss()
    assert faiss is not None  # resolve_backend checked it
    _check_no_overflow(h)
    with _faiss_threads(faiss, torch.get_num_threads()):
        index = faiss_ivf.build_index(faiss, h.numpy(), faiss_ivf.faiss_ivf_plan(h.shape[0], mips), progress)
        for start, stop in bounds:
            yield slice(start, stop), *faiss_ivf.search(faiss, index, h, start, stop, s)


def _torch_top_s(
    h: torch.Tensor, s: int, bounds: list[tuple[int, int]]
) -> Generator[tuple[slice, torch.Tensor, torch.Tensor], None, None]:
    """Yield ``(rows, ids, similarities)`` of each block's top s, self excluded."""
    h_t = h.t().contiguous()  # one transposed copy, not one per block
    for start, stop in bounds:
        scores = h[start:stop] @ h_t
        local = torch.arange(stop - start, device=h.device)
        scores[local, start + local] = float("-inf")  # self-similarity is not an edge
        values, ids = top_s(scores, s)
        del scores  # free the block before the next one is allocated
        yield slice(start, stop), ids.cpu(), values.cpu()


def _fused_top_s(
    h: torch.Tensor, s: int, bounds: list[tuple[int, int]]
) -> Generator[tuple[slice, torch.Tensor, torch.Tensor], None, None]:
    """Yield ``(rows, ids, similarities)`` of each block's top s via the fused numba kernel."""
    fused_knn = _import_fused()
    assert fused_knn is not None  # resolve_backend checked it
    points = h.numpy()
    _check_no_overflow(h)
    columns = fused_knn.prepare_columns(points)
    threads = torch.get_num_threads()
    for start, stop in bounds:
        # Per block, not around the generator: the caller runs torch between blocks.
        with _numba_threads(threads):
            scores, ids = fused_knn.top_s_rows(points, columns, s, start, stop)
        yield slice(start, stop), torch.from_numpy(ids), torch.from_numpy(scores)


def _check_no_overflow(h: torch.Tensor) -> None:
    """The numba kernels keep scores in float32 and mark "none yet" with float32's lowest value, so no
    score may overflow: ``|h_i · h_j| <= max ‖h‖²`` (Cauchy-Schwarz) bounds them all."""
    largest = float(h.to(torch.float64).square().sum(dim=1).max())
    if not largest < float(torch.finfo(torch.float32).max) / 2:
        raise ConfigError(_OVERFLOW_MESSAGE)


@contextmanager
def _numba_threads(n: int) -> Iterator[None]:
    """Run numba kernels on ``n`` threads (at most numba's pool), handing blocks out one at a time,
    and restore every thread setting it touches afterwards.

    numba's OpenMP threading layer sets the calling thread's OpenMP thread count when it launches
    a kernel, and torch (and faiss, when imported after torch) may resolve to that same libgomp:
    without the restore a fused call silently moves a host pinned to one thread onto all cores.
    """
    # Read before numba's first call in the process, which is what starts its layer.
    faiss = sys.modules.get("faiss")
    torch_threads, faiss_threads = torch.get_num_threads(), faiss.omp_get_max_threads() if faiss else None
    import numba

    numba_threads = numba.get_num_threads()
    numba.set_num_threads(max(1, min(n, numba.config.NUMBA_NUM_THREADS)))
    try:
        with numba.parallel_chunksize(_FUSED_CHUNKSIZE):
            yield
    finally:
        numba.set_num_threads(numba_threads)
        torch.set_num_threads(torch_threads)
        if faiss is not None:
            faiss.omp_set_num_threads(faiss_threads)


def _faiss_top_s(
    h: torch.Tensor, s: int, bounds: list[tuple[int, int]]
) -> Generator[tuple[slice, torch.Tensor, torch.Tensor], None, None]:
    """Yield ``(rows, ids, similarities)`` of each block's top s via exact faiss search."""
    faiss = _import_faiss()
    assert faiss is not None  # resolve_backend checked it
    points = h.numpy()
    with _faiss_threads(faiss, torch.get_num_threads()), _faiss_tiles(faiss):
        index = faiss.IndexFlatIP(points.shape[1])
        index.add(points)
        for start, stop in bounds:
            scores, ids = index.search(points[start:stop], s + 1)
            yield (
                slice(start, stop),
                *drop_self(torch.from_numpy(ids), torch.from_numpy(scores), torch.arange(start, stop)),
            )


def _block_bounds(m: int, rows: int, fold_short_tail: bool = False) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive row blocks of ``rows`` rows covering ``0..m``.

    With ``fold_short_tail`` a last block shorter than half a block joins the previous one.
    """
    starts = list(range(0, m, rows))
    if fold_short_tail and len(starts) > 1 and m - starts[-1] < rows // 2:
        starts.pop()
    ends = starts[1:] + [m] if starts else []
    return list(zip(starts, ends, strict=True))


@contextmanager
def _faiss_tiles(faiss: ModuleType) -> Iterator[None]:
    """Run faiss' exact search on tiles of ``_FAISS_TILE`` (queries x database rows), restoring its
    global setting afterwards.

    faiss scores 4096 queries x 1024 rows at a time by default: a 16 MB tile that leaves the
    cache before its heap pass reads it back. A few hundred queries against tens of thousands of
    rows keep the candidates' rows in cache instead: 14.8 s against 22.6 s for 10^5 rows, D = 16,
    k = 101 on 2 cores (measured 2026-11-26; also 15.9 s at 256 x 16384, 17.3 s at 512 x 8192).
    """
    queries, rows = _FAISS_TILE
    previous = (faiss.cvar.distance_compute_blas_query_bs, faiss.cvar.distance_compute_blas_database_bs)
    faiss.cvar.distance_compute_blas_query_bs = queries
    faiss.cvar.distance_compute_blas_database_bs = rows
    try:
        yield
    finally:
        faiss.cvar.distance_compute_blas_query_bs, faiss.cvar.distance_compute_blas_database_bs = previous


@contextmanager
def _faiss_threads(faiss: ModuleType, n: int) -> Iterator[None]:
    """Run faiss with ``n`` OpenMP threads, restoring its previous setting afterwards.

    faiss and torch each ship their own OpenMP runtime. Left alone, faiss sizes its pool from
    the core count regardless of ``torch.set_num_threads``, which oversubscribes a host that
    was deliberately limited; matching torch makes one knob control both.
    """
    previous = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(previous)


# --------------------------------------------------------------------------------------------
# Validation and backend choice.


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}") from None
    if number < 1:
        raise ConfigError(f"{name} must be a positive integer, got {number}")
    return number


def _validated_embeddings(embeddings: object) -> torch.Tensor:
    if not isinstance(embeddings, torch.Tensor):
        raise ConfigError(f"embeddings must be a torch.Tensor, got {type(embeddings).__name__}")
    if embeddings.dim() != 2:
        raise ConfigError(f"embeddings must be 2-D (nodes x dims), got shape {tuple(embeddings.shape)}")
    if embeddings.shape[1] == 0:
        raise ConfigError("embeddings must have at least one column")
    if embeddings.is_complex() or embeddings.dtype == torch.bool:
        raise ConfigError(f"embeddings must be real-valued, got dtype {embeddings.dtype}")
    h = embeddings.detach().to(torch.float32)
    if not torch.isfinite(h).all():
        raise ConfigError("embeddings must be finite (as float32): found NaN or infinity")
    return h


def _import_faiss() -> ModuleType | None:
    try:
        import faiss
    except ImportError:
        return None
    return faiss


def _import_fused() -> ModuleType | None:
    """The fused kernel's module, or ``None`` without numba."""
    try:
        from fedgl_secure.engine import fused_knn
    except ImportError:
        return None
    return fused_knn


def resolve_backend(
    backend: str,
    device: torch.device | str | None = None,
    num_nodes: int | None = None,
    num_dims: int | None = None,
) -> tuple[str, torch.device]:
    """The backend ``discover_pseudo_graph`` will run and its device (fused, faiss, faiss_ivf, planar: the CPU).

    ``num_nodes`` is ``M`` and ``num_dims`` is ``D``: ``auto`` picks ``planar`` for ``D = 2``, else
    ``faiss_ivf`` (``ivf`` without faiss), above ``APPROXIMATE_MIN_NODES`` on a CPU (and
    ``APPROXIMATE_MIN_NODES_CUDA`` on a GPU, where the approximate one is ``ivf``), and on a CPU the
    fused kernel from ``FUSED_MIN_NODES`` (``None``: assume small). Public so callers can log or
    record what ``"auto"`` chose on this host.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {BACKENDS}, got {backend!r}")
    cpu = torch.device("cpu")
    target: torch.device | None = None
    if device is not None:
        try:
            target = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ConfigError(f"device {device!r} is not a valid torch device: {error}") from None
        if target.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device {device!r} requested but CUDA is not available")
    if backend == "planar" and num_dims is not None and num_dims != 2:
        raise ConfigError(f"backend 'planar' needs embeddings with 2 columns, got {num_dims}; use 'auto'")
    if backend in ("fused", "faiss", "faiss_ivf", "planar"):
        if target is not None and target.type != "cpu":
            raise ConfigError(f"device {device!r} needs backend 'torch' or 'ivf': backend {backend!r} runs on the CPU")
        if backend == "fused" and _import_fused() is None:
            raise ConfigError("backend 'fused' needs the numba package; install it or use backend 'faiss' or 'torch'")
        if backend in ("faiss", "faiss_ivf") and _import_faiss() is None:
            fallback = "'ivf'" if backend == "faiss_ivf" else "'torch'"
            raise ConfigError(f"backend {backend!r} needs the faiss-cpu package; install it or use backend {fallback}")
        return backend, cpu
    if target is None:
        target = torch.device("cuda") if torch.cuda.is_available() else cpu
    if backend in ("torch", "ivf"):
        return backend, target
    # auto
    threshold = APPROXIMATE_MIN_NODES_CUDA if target.type == "cuda" else APPROXIMATE_MIN_NODES
    if num_nodes is not None and num_nodes > threshold:
        if num_dims == 2:
            return "planar", cpu
        if target.type == "cpu" and _import_faiss() is not None:
            return "faiss_ivf", cpu
        return "ivf", target
    large = num_nodes is not None and num_nodes >= FUSED_MIN_NODES
    if target.type == "cpu" and large and _import_fused() is not None:
        return "fused", cpu
    if target.type == "cpu" and _import_faiss() is not None:
        return "faiss", cpu
    return "torch", target or cpu
