"""The router's speed profile fitted to the model being served.

`calibration_points` times real rankings on one instance's engine (a few of the catalog's
users, each ranked twice with `full` and twice with `rcllm`, the faster of each pair kept, so
computed and reused token counts vary and a run slowed by other work on the machine is
dropped), and `fit_served_profile` fits `schedule.fit.fit_cpu_profile` to them on a
base profile whose `ModelSpec` is the served model's own shape (KV bytes per token included).
A fitted profile can be stored as JSON (`save_profile`) and loaded at the next start
(`load_profile`) instead of calibrating again.
"""

from __future__ import annotations

from ..errors import RcllmError
from ..routing import ModelSpec, SpeedProfile, cpu_smollm2_profile
from ..routing.profiles import load_profile, save_profile  # noqa: F401 (the serve API)

CALIBRATION_METHODS = ("full", "rcllm")
REPEATS = 2                          # runs per (user, method); the fastest is kept
Point = tuple[int, int, float, str]                 # computed, context tokens, ms, method


def served_model_spec(engine) -> ModelSpec:
    """The served model's shape as the cost model reads it (KV in the engine's dtype)."""
    a = engine.model.arch
    return ModelSpec(a.model_type, a.num_layers, a.hidden_size, a.num_heads, a.num_kv_heads,
                     a.head_dim, a.intermediate_size,
                     kv_dtype_bytes=int(engine.model.dtype.itemsize))


def calibration_points(engine, dataset, cases: int = 3, repeats: int = REPEATS) -> list[Point]:
    """(computed, context, TTFT ms, method) of real rankings of `cases` users of `dataset`
    (leave-last-out requests with up to 9 negatives). The user-prefix cache is not used (its
    entries and hit counters stay those of real traffic); chunk KV the rankings build stays
    in the store, as any ranking's would."""
    from ..eval.protocol import build_cases
    from ..prompt.builder import RankRequest

    built = build_cases(dataset, history_window=engine.cfg.prompt.history_window or 10,
                        num_negatives=min(9, max(1, len(dataset.items) - 2)), seed=0,
                        max_cases=cases)
    if not built:
        raise RcllmError("calibration needs at least one user with history in the data")
    points: list[Point] = []
    for case in built:
        req = RankRequest(case.user_id, tuple(case.history), tuple(case.candidates))
        for method in CALIBRATION_METHODS:
            runs = []
            for _ in range(max(1, repeats)):
                res = engine.rank(req, method, user_prefix=False)   # leaves that cache alone
                runs.append((int(res.stats["recomputed_tokens"]), int(res.stats["tokens"]),
                             float(res.ttft_ms), method))
            points.append(min(runs, key=lambda p: p[2]))   # least disturbed by other work
    return points


def fit_served_profile(points: list[Point], model: ModelSpec) -> SpeedProfile:
    """A CPU profile of `model` fitted to `points` (KV stays in host memory: transfer free)."""
    from ..routing.fit import fit_cpu_profile

    base = cpu_smollm2_profile().replace(name=f"{model.name}@calibrated", model=model)
    usable = [p for p in points if p[2] > 0 and 0 <= p[0] <= p[1]]
    fitted = fit_cpu_profile([(c, n, ms) for c, n, ms, _m in usable],
                             [m for *_x, m in usable], base=base)
    return fitted.replace(name=base.name)


def router_profile(how: str | SpeedProfile, calibrate) -> SpeedProfile:
    """The profile a router's cost model prices requests with: "calibrate" (fitted to timed
    rankings now: `calibrate()` returns an instance's `calibrate` row), "builtin" (the
    unfitted SmolLM2 CPU profile), or a profile object (loaded from a file saved by an earlier
    calibration)."""
    if isinstance(how, SpeedProfile):
        return how
    if how == "builtin":
        return cpu_smollm2_profile()
    if how != "calibrate":
        raise RcllmError(f"profile must be calibrate, builtin or a loaded profile, not {how!r}")
    row = calibrate()
    return fit_served_profile([tuple(p) for p in row["points"]], ModelSpec(**row["model"]))
