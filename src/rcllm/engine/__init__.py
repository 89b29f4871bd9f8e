"""The single-process engine: request → prompt → cache look-ups → prefill → scores.

- `core`: `Engine` and its `rank`, which reads as those phases;
- `scorers`: the ranking strategies (listwise verbalizer, likelihood, pointwise yes/no);
- `lookups`: every cache's look-up (one shape, `KVMatch`) assembled into the prefill's inputs;
- `gather`: reused KV copied in layer by layer beside the prefill;
- `records`: `RankResult` and `RankStats`; `explain`: the token-by-token view.
"""

from ..config import REUSE_METHODS
from ..report import UNTUNED_NOTE
from .core import Engine
from .records import SOURCES, RankResult, RankStats
from .scorers import SCORERS, Scorer, make_scorer

__all__ = ["Engine", "RankResult", "RankStats", "REUSE_METHODS", "SCORERS", "SOURCES", "Scorer",
           "make_scorer", "UNTUNED_NOTE"]
