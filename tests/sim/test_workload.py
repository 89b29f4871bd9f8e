
import numpy as np
import pytest

from rcllm.errors import RcllmError
from rcllm.sim import SyntheticSpec, build_locality, poisson_arrivals_ms, synthetic_workload
from rcllm.sim.placement import hot_mask


def test_synthetic_long_tail_and_communities():
    spec = SyntheticSpec(num_items=20_000, num_requests=5000, num_communities=50,
                         p_community=0.8)
    w = synthetic_workload(spec)
    freq = np.bincount(w.candidates.ravel(), minlength=w.num_items)
    top = np.sort(freq)[::-1]
    assert top[:20].sum() > 0.1 * freq.sum()           # 0.1% of items draw >10% of picks
    assert (freq == 0).mean() > 0.2                    # and a long unseen tail
    comm = w.community[w.candidates]
    same = (comm == comm[:, :1]).mean(axis=1)           # share sharing the first's community
    assert np.median(same) > 0.5
    assert np.all((w.item_tokens >= 20) & (w.item_tokens <= 400))
    assert 1500 < np.median(w.context_tokens()) < 4000


def test_synthetic_scales_to_a_million_items():
    w = synthetic_workload(SyntheticSpec(num_items=1_000_000, num_requests=2000,
                                         placement_requests=2000, num_communities=1000))
    assert w.num_items == 1_000_000 and w.candidates.max() < 1_000_000
    loc = build_locality(w, 40, "community")
    assert loc.is_hot.sum() == 1000                    # the top 0.1% replicated
    assert set(np.unique(loc.shard)) == set(range(40))


def test_placements_hot_and_shards():
    w = synthetic_workload(SyntheticSpec(num_items=4000, num_requests=500, num_communities=40))
    mask = hot_mask(w, 0.001)
    assert mask.sum() == 4 and mask[0]
    comm = build_locality(w, 8, "community")
    assert np.array_equal(comm.shard, w.community % 8)
    local = comm.local_tokens(w.candidates[0], w.item_tokens[w.candidates[0]])
    assert local.shape == (8,) and local.max() <= w.item_tokens[w.candidates[0]].sum()
    with pytest.raises(RcllmError):
        build_locality(w, 8, "nope")


def test_metis_placement_beats_hash_on_hit_rate():
    w = synthetic_workload(SyntheticSpec(num_items=2000, num_requests=500,
                                         placement_requests=1500, num_communities=16))
    def best_hits(loc):
        return np.mean([loc.local_tokens(c, w.item_tokens[c]).max() / w.item_tokens[c].sum()
                        for c in w.candidates])
    metis = build_locality(w, 8, "metis")
    assert best_hits(metis) > best_hits(build_locality(w, 8, "hash")) + 0.1


def test_trace_workload_from_eval_protocol():
    from rcllm.sim.traces import trace_workload
    w = trace_workload("", "synthetic", num_requests=300, num_users=40, num_items=100)
    assert w.candidates.shape == (300, 20) and w.candidates.max() < w.num_items
    assert w.community is None and len(w.placement_requests) <= 40
    assert np.all(w.history_tokens > 0)
    assert w.retrieval_recall is None


def test_trace_workload_with_retrieved_candidates():
    from rcllm.sim.traces import trace_workload
    opts = dict(num_requests=300, num_users=40, num_items=100)
    pop = trace_workload("", "synthetic", **opts)
    ret = trace_workload("", "synthetic", candidate_source="retrieval", **opts)
    assert ret.name.endswith(":retrieval") and 0.0 < ret.retrieval_recall <= 1.0
    assert ret.candidates.shape == (300, 20)
    # the shortlists differ from the popularity-sampled lists
    assert not np.array_equal(np.sort(ret.placement_requests, 1), np.sort(pop.placement_requests, 1))


def test_poisson_arrivals_rate():
    arr = poisson_arrivals_ms(np.random.default_rng(0), 20000, qps=50.0)
    assert np.all(np.diff(arr) > 0)
    assert 20000 / (arr[-1] / 1000) == pytest.approx(50.0, rel=0.05)
    with pytest.raises(RcllmError):
        poisson_arrivals_ms(np.random.default_rng(0), 10, 0.0)
