"""Pointwise ranking over a cached user prefix (PAPERS.md §2) and pre-inference relay (§4).

- the prompt lives in `rcllm.prompt.pointwise`, beside the listwise builder: the user side
  (instruction + review history) first, then one short "Will I like X? Answer:" suffix per
  candidate, scored as P(" Yes") against P(" No").
- `side`: the engine's user-side interface — `lookup` before the prefill, `store` after the
  answer, `prewarm` (pre-inference).
- `scoring`: the user-side KV computed once; all candidates scored in one batched pass with a
  block mask (each suffix sees the prefix and itself only); an independent-forward reference.
- `append`: new behaviour appended to a cached prefix (forward with past) and its drift.
- `cache` / `expander`: the per-user prefix cache (TTL, LRU by bytes, INT8, singleflight,
  hit-rate metric) and its host-memory spill tier.
- `ranker`: the facade tying prompt, cache and scoring together.
- `relay` / `relay_sim`: RelayGR's trigger, affinity router and prewarm, and a small
  discrete-event simulation measuring them.
"""
