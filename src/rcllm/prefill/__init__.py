"""Prefill with mixed reused / recomputed tokens, token selection, and scoring."""

from .selective import PrefillInputs, PrefillResult, prefill
from .selection import SelectionPolicy, selection_policy

__all__ = ["PrefillInputs", "PrefillResult", "prefill", "SelectionPolicy", "selection_policy"]
