"""`rcllm sim sweep`'s fitting steps, kept apart from the command module: the engines'
slowdown F (given, or measured on bench ttft runs or on a separate served run), the builders'
CPU weight on the served run, and the printed pricing notes."""

from __future__ import annotations

import os

import numpy as np

from ..errors import RcllmError


def _busy_slowdown(args, sweep, profile, reference):
    """(F: one number or per engine method, the requests it was measured on or None, the
    --served-from run or None): --busy-slowdown as given, or measured on two bench ttft runs
    (--busy-from) or on a separate served run (--served-from), never on the sweep."""
    if args.busy_slowdown <= 0:
        raise RcllmError("--busy-slowdown must be > 0")
    if sum([bool(args.busy_from), bool(args.served_from), args.busy_slowdown != 1.0]) > 1:
        raise RcllmError("--busy-slowdown, --busy-from and --served-from each set F: give one")
    slowdown, pairs, calibration = args.busy_slowdown, None, None
    if args.busy_from:
        from ..routing.validate import load_bench_requests
        from ..sim.slowdown import busy_slowdown_from

        paths = args.busy_from.split(",")
        if len(paths) != 2:
            raise RcllmError("--busy-from takes ALONE.json,SHARED.json")
        slowdown, pairs = busy_slowdown_from(*(load_bench_requests(p) for p in paths))
        print(f"busy slowdown per method (median over {pairs} requests, {args.busy_from}): "
              + ", ".join(f"{m} {f:.3f}" for m, f in slowdown.items()))
    if args.served_from:
        from ..sim.served import load_sweep, service_ms, speed_scale
        from ..sim.slowdown import same_run, served_slowdown_from

        calibration = load_sweep(args.served_from)
        if same_run(calibration, sweep):
            raise RcllmError(f"--served-from {args.served_from} is the sweep being predicted: "
                             "F must come from a separate served run")
        slowdown, pairs = served_slowdown_from(
            calibration, lambda m, c, x: service_ms(profile, m, c, x),
            lambda cell: speed_scale(cell, reference))
        print(f"served slowdown per method (engine thread CPU over the profile's price, median "
              f"over {pairs} requests of {args.served_from}): "
              + ", ".join(f"{m} {f:.3f}" for m, f in slowdown.items()))
    return slowdown, pairs, calibration


def _print_pricing(args, cost, builds, reference, rows, summary) -> None:
    """What the prediction priced requests and behind work with, and what it left out."""
    if args.service == "measured":
        print("service = each request's measured engine TTFT (no cost model, no behind work, "
              "no scaling): the error left is the queueing model's and the time outside the "
              "engine")
    elif not args.no_behind:
        print(f"work behind an answer priced per job at {cost[0]:.1f} ms + {cost[1]:.2f} ms per "
              f"token (fitted on the {len(builds)} chunk builds of {args.fit_json})" if cost else
              f"note: {args.fit_json} has no timed chunk builds (recorded before bench ttft "
              "timed them): each job behind an answer priced as a forward pass")
    scales = [r["speed_scale"] for r in rows]
    if args.service != "profile":
        pass                        # measured times are not scaled
    elif reference is not None and scales:
        print(f"each cell scaled to the machine's speed in it: cell reference / fit reference "
              f"({reference:.0f} ms) from {min(scales):.3f} to {max(scales):.3f}, median "
              f"{float(np.median(scales)):.3f} (cells without a reference: 1)")
    elif args.speed_reference:
        print(f"note: {args.fit_json} has no speed reference (recorded before bench ttft timed "
              "it): cells not scaled to the machine's speed")
    if not summary["behind_recorded"]:
        print("note: this sweep predates behind_tokens (the work each answer queues behind "
              "it): predicted without it")


def _served_weight(calibration, profile, args, slowdown, cost, reference) -> float:
    """The builders' CPU weight measured on the --served-from run (`served_builder_weight`):
    its cells replayed as the sweep is predicted, with the F just measured."""
    from ..sim.served import behind_weight, simulate_engine, speed_scale, sweep_instances
    from ..sim.slowdown import served_builder_weight

    k = sweep_instances(calibration)
    cores = float(calibration.get("cpu_count") or os.cpu_count() or 1)

    def engine_ms(cell, w):
        return simulate_engine(cell["arrivals_s"], cell["requests"], profile, k, cell["policy"],
                               "replay", args.overhead_ms, slowdown, cores, cost,
                               speed_scale(cell, reference), builder_weight=w)[3]

    weight, n = served_builder_weight(calibration, engine_ms)
    nice = int(calibration.get("behind_nice", 0))
    print(f"builders' CPU weight against an engine {weight:.3f} (the engine time of {n} answers "
          f"of {args.served_from} replayed; CFS's at their nice {nice}: "
          f"{behind_weight(nice):.3f})")
    return weight
