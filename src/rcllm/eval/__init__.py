"""Evaluation: dataset loaders, the leave-last-out protocol and ranking/fidelity metrics.

Kept light on purpose (no torch): `rcllm.eval.datasets`, `rcllm.eval.protocol` and
`rcllm.eval.metrics` import only numpy/scipy, so the simulator and tests can use them cheaply.
"""
