"""The item co-occurrence graph: an edge joins two items that appear in the same request.

A "request" is any list of items that one inference touches together: a candidate list, a
user's history window, or both. Edge weight = number of requests in which the pair co-occurs.
Stored as CSR (xadj/adjncy/eweights), which is what METIS consumes directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Sequence

import numpy as np


@dataclass(frozen=True)
class CooccurrenceGraph:
    """Undirected weighted graph over `nodes` (index i ↔ nodes[i]), CSR form, no self-loops.

    Neighbours of node i are adjncy[xadj[i]:xadj[i+1]] with weights eweights[same slice].
    `frequency[i]` = number of requests containing node i (each request counts an item once).
    """

    nodes: tuple[Hashable, ...]
    xadj: np.ndarray       # [N+1] int64
    adjncy: np.ndarray     # [2E] int64
    eweights: np.ndarray   # [2E] int64
    frequency: np.ndarray  # [N] int64

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def num_edges(self) -> int:
        return len(self.adjncy) // 2

    def edge_weight(self, a: int, b: int) -> int:
        """Weight of edge (a, b) by node index; 0 when absent."""
        lo, hi = self.xadj[a], self.xadj[a + 1]
        hits = np.nonzero(self.adjncy[lo:hi] == b)[0]
        return int(self.eweights[lo + hits[0]]) if len(hits) else 0

    def check_invariants(self) -> None:
        n = self.num_nodes
        assert len(self.xadj) == n + 1 and self.xadj[0] == 0
        assert self.xadj[-1] == len(self.adjncy) == len(self.eweights)
        assert np.all(np.diff(self.xadj) >= 0), "xadj not monotone"
        assert np.all(self.eweights > 0), "non-positive edge weight"
        for i in range(n):
            nbrs = self.adjncy[self.xadj[i]:self.xadj[i + 1]]
            assert i not in nbrs, f"self-loop on node {i}"
        src = np.repeat(np.arange(n), np.diff(self.xadj))
        fwd = set(zip(src.tolist(), self.adjncy.tolist(), self.eweights.tolist()))
        back = set(zip(self.adjncy.tolist(), src.tolist(), self.eweights.tolist()))
        assert fwd == back, "graph is not symmetric"


def build_cooccurrence(requests: Sequence[Sequence[Hashable]],
                       nodes: Sequence[Hashable] | None = None) -> CooccurrenceGraph:
    """Builds the graph from requests; `nodes` fixes the node set and order (items of requests
    not in `nodes` are ignored; nodes never seen become isolated). Default: items in first-seen
    order."""
    if nodes is None:
        seen: dict[Hashable, None] = {}
        for req in requests:
            for item in req:
                seen.setdefault(item, None)
        nodes = list(seen)
    index = {item: i for i, item in enumerate(nodes)}
    n = len(nodes)
    frequency = np.zeros(n, dtype=np.int64)
    pair_codes: list[np.ndarray] = []
    for req in requests:
        ids = np.unique(np.fromiter((index[x] for x in req if x in index), dtype=np.int64))
        frequency[ids] += 1
        if len(ids) > 1:
            a, b = np.triu_indices(len(ids), k=1)
            pair_codes.append(ids[a] * n + ids[b])
    if pair_codes:
        codes, counts = np.unique(np.concatenate(pair_codes), return_counts=True)
    else:
        codes, counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
    lo, hi = codes // max(n, 1), codes % max(n, 1)
    src = np.concatenate([lo, hi])
    dst = np.concatenate([hi, lo])
    wts = np.concatenate([counts, counts]).astype(np.int64)
    order = np.lexsort((dst, src))
    src, dst, wts = src[order], dst[order], wts[order]
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=xadj[1:])
    return CooccurrenceGraph(tuple(nodes), xadj, dst.astype(np.int64), wts, frequency)
