"""Requests → typed segments → token ids with exact segment boundaries."""

from .builder import LABELS, Prompt, PromptBuilder, RankRequest, Segment

__all__ = ["LABELS", "Prompt", "PromptBuilder", "RankRequest", "Segment"]
