"""Affinity's balance between hits and load, derived from the TTFT cost model (issue 51).

Affinity scores an instance hit_rate^w_hit · idleness^w_idle with idleness = 1 / (1 + W / ref)
(W its outstanding work, ref this request's service time at its best-hit instance). A fixed
w_idle is right for one operating point only: the value 4 was tuned on 40 simulated instances,
where a request's best instance holds a small share of its items, and at 2 instances it lets
load decide nearly every choice. The cost model says what a hit is worth: moving the hit rate
by dh saves dh · M ms, M = the recompute time of all of the request's items (`miss_ms`), and a
longer queue costs its wait ms for ms. Matching affinity's marginal rates to those at the point
(h, W) of the decision,

    w_hit / h · dh  =  w_idle / (ref + W) · dW     with   dh · M = dW

gives w_idle = w_hit · (ref + W) / (h · M) (`idle_weight`). To first order around that point
affinity then ranks instances as the cost model's TTFT does; away from it the product form
keeps affinity's shape (a zero-hit instance is never preferred for its locality). The instance
count enters through h: the more instances, the smaller the share of a request's items its best
instance holds, and the more a queue weighs; a larger M (longer items, a slower model) weighs
hits more. Every term comes from the router's speed profile, fitted on a calibration run
(serve/calibrate.py, or a saved `--profile`), never from the sweep it is judged on.
"""

from __future__ import annotations

import math

import numpy as np

from .cost import CostModel, RequestShape

HIT_FLOOR = 1e-3      # the hit rate affinity adds before its power: no instance scores 0


def miss_ms(cost: CostModel, shape: RequestShape) -> float:
    """Service time the request's items cost when every one is recomputed rather than reused:
    service with no item local − service with every item local (>= 0)."""
    none = float(cost.service_ms(cost.work(shape, 0)))
    every = float(cost.service_ms(cost.work(shape, shape.item_tokens)))
    return max(0.0, none - every)


def idle_weight(cost: CostModel, shape: RequestShape, hit_rate: float, wait_ms: float,
                w_hit: float = 1.0) -> float:
    """w_idle = w_hit · (ref + W) / (h · M) at hit rate `hit_rate` and queue wait `wait_ms`
    (module docstring); inf when the items' misses cost nothing (load alone decides)."""
    m = miss_ms(cost, shape)
    if m <= 0:
        return math.inf
    ref = float(cost.service_ms(cost.work(shape, hit_rate * shape.item_tokens)))
    return w_hit * (ref + max(0.0, wait_ms)) / (max(hit_rate, HIT_FLOOR) * m)


def decision_weight(cost: CostModel, shape: RequestShape, local_tokens: np.ndarray,
                    outstanding_ms: np.ndarray, w_hit: float = 1.0) -> float:
    """`idle_weight` at one routing decision: h = the request's hit rate at its best-hit
    instance, W = the mean outstanding work over the instances (the wait a choice blind to
    load would meet)."""
    total = max(float(shape.item_tokens), 1.0)
    return idle_weight(cost, shape, float(np.max(local_tokens)) / total,
                       float(np.mean(outstanding_ms)), w_hit)


def miss_cost_ms(cost: CostModel, context_tokens: int, item_tokens: int,
                 missed_item_tokens: int) -> float:
    """The TTFT that `missed_item_tokens` of a request's `item_tokens` cost by being computed
    on the spot instead of reused, as the cost model prices them (a request of
    `context_tokens`, the rest of it fresh)."""
    items = max(0, int(item_tokens))
    missed = min(max(0, int(missed_item_tokens)), items)
    shape = RequestShape(0, max(0, int(context_tokens) - items), 0, 0, items)
    held = float(cost.service_ms(cost.work(shape, items - missed)))
    every = float(cost.service_ms(cost.work(shape, items)))
    return max(0.0, held - every)


def import_saving_ms(fetch_cost: CostModel, shape: RequestShape, local_tokens: float,
                     recompute_ms: float) -> float:
    """What fetching a request's items missing on an instance saves over recomputing them
    there: `recompute_ms` (the request's service with them recomputed, as the router already
    estimated it) minus its service with them fetched; <= 0 when fetching does not pay. Also
    the most the instance should wait for the fetched KV (serve/imports.py, the replay)."""
    return recompute_ms - float(fetch_cost.service_ms(fetch_cost.work(shape, local_tokens)))
