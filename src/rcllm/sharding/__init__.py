"""Item-catalog sharding: co-occurrence graph, hot-item replication, METIS shards.

Imports no torch: the simulator and the scheduler use placements as plain Python objects.
"""

from .graph import CooccurrenceGraph, build_cooccurrence
from .sharding import METHODS, Placement, build_placement, hot_items, shuffled_like
from .tokens import estimate_tokens

__all__ = ["METHODS", "CooccurrenceGraph", "Placement", "build_cooccurrence", "build_placement",
           "estimate_tokens", "hot_items", "shuffled_like"]
