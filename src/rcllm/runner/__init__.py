"""Prefill with mixed reused / recomputed tokens, token selection, and scoring."""

from .prefill import PrefillInputs, PrefillResult, prefill
from .select import SelectionPolicy, make_policy

__all__ = ["PrefillInputs", "PrefillResult", "prefill", "SelectionPolicy", "make_policy"]
