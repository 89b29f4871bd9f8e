"""Semantic history cache: LSH prototypes of review tokens with precomputed KV (docs/prototypes.md)."""

from .library import BuildOptions, Match, PrototypeLibrary

__all__ = ["BuildOptions", "Match", "PrototypeLibrary"]
