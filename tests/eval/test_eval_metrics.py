import math

import numpy as np
import pytest

from rcllm.eval import metrics as m


def test_rank_hr_ndcg_by_hand():
    scores = [0.1, 0.9, 0.5, 0.7]  # target index 2 has rank 3
    assert m.target_rank(scores, 2) == 3
    assert m.hit_rate(scores, 2, 3) == 1.0 and m.hit_rate(scores, 2, 2) == 0.0
    assert m.ndcg(scores, 2, 5) == pytest.approx(0.5)  # 1/log2(4)
    assert m.ndcg(scores, 1, 1) == 1.0
    assert m.ndcg(scores, 2, 2) == 0.0
    got = m.ranking_metrics(scores, 3, ks=(1, 5))
    assert got == {"hr@1": 0.0, "ndcg@1": 0.0, "hr@5": 1.0,
                   "ndcg@5": pytest.approx(1 / math.log2(3))}


def test_ties_count_against_the_target():
    assert m.target_rank([1.0, 1.0, 1.0], 0) == 3
    assert m.hit_rate([2.0, 2.0, 0.0], 1, 1) == 0.0
    with pytest.raises(ValueError):
        m.target_rank([0.1, float("nan")], 0)
    with pytest.raises(ValueError):
        m.target_rank([0.1, 0.2], 2)


def test_bootstrap_ci():
    ci = m.bootstrap_ci([1.0] * 10)
    assert (ci.mean, ci.low, ci.high) == (1.0, 1.0, 1.0)
    values = np.random.default_rng(0).normal(0.5, 0.1, size=400)
    ci = m.bootstrap_ci(values, seed=1)
    assert ci.low < 0.5 < ci.high and ci.high - ci.low == pytest.approx(0.0196, abs=0.004)
    assert ci == m.bootstrap_ci(values, seed=1)


def test_paired_bootstrap_ci():
    a = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0] * 20)
    ci = m.paired_bootstrap_ci(a, a)
    assert (ci.mean, ci.low, ci.high) == (0.0, 0.0, 0.0)
    ci = m.paired_bootstrap_ci(a, a - 0.1)
    assert ci.mean == pytest.approx(0.1) and ci.low == pytest.approx(0.1)
    with pytest.raises(ValueError):
        m.paired_bootstrap_ci([1.0], [1.0, 2.0])


def test_cluster_bootstrap_resamples_whole_groups():
    # two users, each all 1s or all 0s: resampling users can draw either twice, so the
    # interval spans [0, 1]; resampling the values alone would give a narrow one
    v = np.array([1.0] * 10 + [0.0] * 10)
    users = ["u"] * 10 + ["v"] * 10
    ci = m.cluster_bootstrap_ci(v, users)
    assert (ci.mean, ci.low, ci.high) == (0.5, 0.0, 1.0)
    flat = m.bootstrap_ci(v)
    assert flat.low > 0.2 and flat.high < 0.8
    # one value per group is the plain bootstrap's law; groups of unequal size weigh by values
    assert m.cluster_bootstrap_ci([2.0, 2.0, 5.0], ["a", "a", "b"]).mean == pytest.approx(3.0)
    with pytest.raises(ValueError):
        m.cluster_bootstrap_ci([1.0, 2.0], ["a"])


def test_fidelity_metrics_by_hand():
    a = [0.9, 0.1, 0.5, 0.3]
    b = [0.8, 0.2, 0.1, 0.6]
    assert m.top1_agreement(a, b)
    assert not m.top1_agreement(a, [0.0, 1.0, 0.0, 0.0])
    assert m.topk_overlap(a, b, 2) == 0.5  # {0,2} vs {0,3}
    assert m.topk_overlap(a, b, 10) == 1.0
    # a ranks 0>2>3>1, b ranks 0>3>1>2: 6 pairs, discordant (2,3),(2,1) -> tau = (4-2)/6
    assert m.kendall_tau(a, b) == pytest.approx(1 / 3)
    assert math.isnan(m.kendall_tau([1, 1, 1], b[:3]))


def test_kl_divergence_is_stable_and_correct():
    p, q = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    expected = 0.5 * math.log(2) + 0.5 * math.log(0.5 / 0.75)
    assert m.kl_from_probs(p, q) == pytest.approx(expected)
    assert m.kl_from_logits(np.log(p), np.log(q)) == pytest.approx(expected)
    assert m.kl_from_logits(np.log(p) + 1e4, np.log(q) - 1e4) == pytest.approx(expected)
    assert m.kl_from_logits([5.0, 1.0, -2.0], [5.0, 1.0, -2.0]) == pytest.approx(0.0, abs=1e-12)
    assert m.kl_from_logits([0.0, -np.inf], [0.0, 0.0]) == pytest.approx(math.log(2))
    assert m.kl_from_probs([1.0, 0.0], [0.0, 1.0]) == math.inf
    batch = m.kl_from_logits(np.zeros((3, 4)), np.zeros((3, 4)))
    assert batch.shape == (3,) and np.allclose(batch, 0.0)
