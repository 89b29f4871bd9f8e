"""`rcllm sim ...` and `rcllm bench sim`: experiments, validation, profiles, speed.

  rcllm sim run cdf|scaling|policy|ratio|all [--out DIR] [--requests N] [--profile P]
                [--placement community|hash|metis] [--load L] [--data PATH --format FMT]
  rcllm sim validate --bench-json PATH [--fit-json OTHER] [--json OUT]
  rcllm sim sweep --sweep-json SWEEP --fit-json BENCH_TTFT [--routing replay|policy] [--out DIR]
  rcllm sim profiles [--vidur-dir DIR]
  rcllm sim map [--out DIR] [--quick] [--set KEY=VALUE ...]   (where cache-aware routing pays)
  rcllm sim bench [--requests N] [--instances K]        (also: rcllm bench sim)
Reports follow rcllm.report's contract; schemas are in docs/simulator.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from ..errors import RcllmError
from ..report import markdown_table, write_report
from .common import positive_ints
from .sim_sweep import _busy_slowdown, _print_pricing, _served_weight

EXPERIMENTS = ("cdf", "scaling", "policy", "ratio")
COLUMNS = {
    "cdf": ["method", "instances", "qps", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
            "mean_item_hit_rate", "p50_speedup_vs_prefix", "p99_speedup_vs_prefix"],
    "scaling": ["instances", "qps", "prefix_p50_ms", "rcllm_p50_ms", "prefix_p99_ms",
                "rcllm_p99_ms", "rcllm_hit_rate", "p50_speedup", "p99_speedup"],
    "policy": ["load_vs_prefix", "qps", "policy", "mean_ttft_ms", "p99_ttft_ms", "hit_rate",
               "max_instance_share"],
    "ratio": ["ratio", "qps", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "mean_ttft_ms"],
}


def _workload(args):
    from ..sim.traces import trace_workload
    from ..sim.workload import SyntheticSpec, synthetic_workload
    if args.data or args.format:
        return trace_workload(args.data or "", args.format or "amazon2018",
                              num_requests=args.requests, seed=args.seed,
                              candidate_source=args.candidate_source)
    if args.candidate_source != "popularity":
        raise RcllmError("--candidate-source retrieval needs a real trace (--data/--format); "
                         "synthetic requests draw candidates from their community")
    return synthetic_workload(SyntheticSpec(num_items=args.items, num_requests=args.requests,
                                            seed=args.seed, zipf_alpha=args.zipf_alpha))


def _zipf(args) -> None:
    """`--zipf-from`: the synthetic catalogue's popularity exponent fitted on a real one."""
    if not getattr(args, "zipf_from", ""):
        return
    if args.data or args.format:
        raise RcllmError("--zipf-from shapes the synthetic catalogue; a real trace "
                         "(--data/--format) has its own popularity")
    from ..sim.traces import popularity_of

    fitted = popularity_of(args.zipf_from)
    args.zipf_alpha = fitted["alpha"]
    print(f"popularity: {json.dumps(fitted)}")


def _run(args) -> int:
    from ..sim import experiments as ex
    from ..sim.plots import plot
    _zipf(args)
    wl = _workload(args)
    placement = args.placement or ("metis" if wl.community is None else "community")
    sc = ex.Scenario(profile=args.profile, placement=placement, load=args.load, seed=args.seed,
                     item_ratio=args.item_ratio, history_ratio=args.history_ratio,
                     hot_fraction=args.hot_fraction)
    ks = _instance_counts(args.ks)
    funcs = {"cdf": ex.cdf_experiment,
             "scaling": lambda w, s: ex.scaling_experiment(w, s, ks),
             "policy": lambda w, s: ex.policy_experiment(w, s, args.policy_instances),
             "ratio": ex.ratio_experiment}
    os.makedirs(args.out, exist_ok=True)
    for name in EXPERIMENTS if args.experiment == "all" else (args.experiment,):
        rows, series = funcs[name](wl, sc)
        config = {**dataclasses.asdict(sc), "workload": wl.name, "requests": wl.num_requests,
                  "candidate_source": args.candidate_source,
                  "zipf_alpha": None if args.data or args.format else args.zipf_alpha,
                  "zipf_from": args.zipf_from or None}
        summary = {"series": {k: {"x": v[0], "y": v[1]} for k, v in series.items()},
                   "retrieval_recall": wl.retrieval_recall}
        base = os.path.join(args.out, f"sim_{name}")
        write_report(base + ".json", f"sim.{name}", config, rows, summary)
        plot(name, series, base + ".png", f"{wl.name}, {sc.profile}, {placement}")
        table = markdown_table(rows, COLUMNS[name])
        with open(base + ".md", "w", encoding="utf-8") as fh:
            fh.write(f"# sim {name}: {wl.name}, {sc.profile}, placement {placement}\n\n{table}\n")
        print(f"## {name}\n{table}\n(wrote {base}.json/.png/.md)\n")
    return 0


def _instance_counts(spec: str) -> list[int]:
    return positive_ints(spec, "--ks")


def _load_runs(paths: str, min_repeats: int) -> list[dict]:
    """bench ttft records of comma-separated repeated runs, merged (the fastest per request
    and variant), kept when measured in at least `min_repeats` runs."""
    from ..routing.validate import merged_records

    kept = merged_records([p for p in paths.split(",") if p], min_repeats)
    if not kept:
        raise RcllmError(f"no record of {paths} was measured in {min_repeats} runs")
    return kept


def _validate(args) -> int:
    from ..routing.validate import validate, validate_transfer

    def load(paths: str):  # comma-separated repeated runs of the same requests
        return _load_runs(paths, args.min_repeats)

    test = load(args.bench_json)
    if args.fit_json:
        rows, summary = validate_transfer(load(args.fit_json), test,
                                          speed_reference=not args.no_speed_reference)
        how = (f"fitted on {args.fit_json}, tested on {args.bench_json}"
               + (", times scaled by each run's speed reference" if summary["speed_reference"]
                  else ""))
    else:
        rows, summary = validate(test, seed=args.seed)
        how = f"split-half of {args.bench_json} (seed {args.seed})"
    print(markdown_table(rows, ["fit", "method", "n_fit", "n_test", "median_rel_err",
                                "p90_rel_err", "measured_p50_ms", "predicted_p50_ms"]))
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    print(f"{how}\nworst median relative error: joint fit "
          f"{fmt(summary['worst_median_rel_err_joint_fit'])}, per-method fit "
          f"{fmt(summary['worst_median_rel_err_per_method_fit'])} (target <= {summary['target']})"
          + (f"; not tested: {', '.join(summary['untested_methods'])}"
             if summary["untested_methods"] else ""))
    if args.json:
        write_report(args.json, "sim.validate", {"bench_json": args.bench_json,
                                                 "fit_json": args.fit_json or None,
                                                 "min_repeats": args.min_repeats,
                                                 "no_speed_reference": args.no_speed_reference,
                                                 "seed": args.seed}, rows, summary)
    return 0


def _sweep(args) -> int:
    from ..sim.served import (fit_behind, fit_profile, load_fit_extras, load_sweep,
                              predict_sweep)
    from ..sim.served_report import write_outputs

    if args.served_weight and not args.served_from:
        raise RcllmError("--served-weight measures the builders' weight on the --served-from "
                         "run: give --served-from")
    sweep = load_sweep(args.sweep_json)
    if args.store_bytes is not None:
        if args.routing != "caches" or args.store_bytes < 1:
            raise RcllmError("--store-bytes (a positive budget) asks --routing caches what the "
                             "sweep would have found at another store budget")
        # what if: the stores replayed at another budget (the measured columns stay the
        # sweep's own, at its budget)
        sweep["config"] = {**(sweep.get("config") or {}), "overrides": [
            *((sweep.get("config") or {}).get("overrides") or ()),
            f"reuse.store_bytes={args.store_bytes}"]}
    if args.no_imports:
        if args.routing != "caches":
            raise RcllmError("--no-imports asks --routing caches what the sweep would do "
                             "without moving item KV between instances")
        sweep["what_if"] = {"no_imports": True}
    profile = fit_profile(_load_runs(args.fit_json, args.min_repeats))
    fit_paths = [p for p in args.fit_json.split(",") if p]
    builds, reference = load_fit_extras(fit_paths)
    cost = fit_behind(builds)
    reference = reference if args.speed_reference else None
    slowdown, pairs, calibration = _busy_slowdown(args, sweep, profile, reference)
    weight = None
    if args.served_weight:
        weight = _served_weight(calibration, profile, args, slowdown, cost, reference)
    rows, summary = predict_sweep(sweep, profile, args.routing, args.overhead_ms, slowdown,
                                  not args.no_behind, cost, reference, args.service, weight)
    _print_pricing(args, cost, builds, reference, rows, summary)
    write_outputs(sweep, rows, summary, profile, args.out,
                  {"sweep_json": args.sweep_json, "fit_json": args.fit_json,
                   "min_repeats": args.min_repeats, "routing": args.routing,
                   "overhead_ms": args.overhead_ms, "busy_from": args.busy_from,
                   "served_from": args.served_from, "served_weight": weight,
                   "busy_slowdown": slowdown, "busy_pairs": pairs,
                   "behind": not args.no_behind, "behind_cost": cost,
                   "fit_reference_ms": reference, "service": args.service,
                   "store_bytes": args.store_bytes, "no_imports": args.no_imports})
    worst = summary["worst_rel_err_below_capacity"]
    print(f"profile fitted on {args.fit_json}; {summary['within_15pct_below_capacity']} of "
          f"{summary['cells_below_capacity']} cells below capacity within 15% (P50 and P99; "
          f"worst {'-' if worst is None else f'{worst:.3f}'}); outputs in {args.out}")
    return 0


def _profiles(args) -> int:
    from ..routing.vidur_fit import BAKED, builtin_profile, fit_all
    rows = []
    fitted = fit_all(args.vidur_dir) if os.path.isdir(args.vidur_dir) else {}
    for key in BAKED:
        p = fitted[key][1] if key in fitted else builtin_profile(key)
        rows.append({"profile": key, "source": "fitted" if key in fitted else "baked",
                     "efficiency": fitted[key][0].efficiency if key in fitted else BAKED[key][0],
                     "fixed_ms": p.fixed_ms, "ms_per_token": p.ms_per_token,
                     "prefill_2048_ms": p.full_prefill_ms(2048),
                     "kv_bytes_per_token": p.model.kv_bytes_per_token})
    print(markdown_table(rows, list(rows[0])))
    return 0


def _map(args) -> int:
    from ..config import load
    from ..sim import map as grid, map_report
    quick = [f"{k}={v}" for k, v in grid.QUICK.items()] if args.quick else []
    spec = load(grid.MapSpec, None, quick + list(args.set))     # validated before any work
    result = grid.run_map(spec)
    for path in map_report.write(result, dataclasses.asdict(spec), args.out):
        print(f"wrote {path}")
    return 0


def _map_parser(sub) -> None:
    from ..config import describe
    from ..sim.map import MapSpec
    mp = sub.add_parser("map", help="where cache-aware routing pays: JSON + markdown + PNG")
    mp.add_argument("--out", default="sim-map")
    mp.add_argument("--quick", action="store_true", help="a small grid, seconds (--set wins)")
    mp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="grid options:" + "".join(describe(MapSpec)))
    mp.set_defaults(func=_map)


ROUTING_INSTANCES, ROUTING_REPEATS = 100, 2000
SIM_TARGET_S, ROUTING_TARGET_US = 30.0, 100.0


def _bench(args) -> int:
    from ..bench.sim import bench_routing, bench_simulator
    if args.requests < 1 or args.instances < 1:
        raise RcllmError("--requests and --instances must be >= 1")
    sim = bench_simulator(args.requests, args.instances, args.seed)
    print(f"simulator: {sim['requests']} requests over {sim['instances']} instances in "
          f"{sim['wall_s']:.2f} s ({sim['requests_per_s']:.0f} requests/s; target <= "
          f"{SIM_TARGET_S:g} s for 100k/40)")
    route = bench_routing(ROUTING_INSTANCES, ROUTING_REPEATS, args.seed)
    print(f"routing decision at {ROUTING_INSTANCES} instances, 20 candidates (target <= "
          f"{ROUTING_TARGET_US:g} us): " + ", ".join(f"{k[:-3]} {v:.1f} us" for k, v in route.items()))
    if args.json:
        rows = [{"policy": k[:-3], "instances": ROUTING_INSTANCES, "candidates": 20,
                 "decision_us": v} for k, v in route.items()]
        summary = {"simulator_requests": sim["requests"],
                   "simulator_instances": sim["instances"], "simulator_wall_s": sim["wall_s"],
                   "simulator_requests_per_s": sim["requests_per_s"],
                   "simulator_target_s": SIM_TARGET_S,
                   "max_decision_us": max(route.values()),
                   "decision_target_us": ROUTING_TARGET_US}
        write_report(args.json, "bench_sim",
                     {"requests": args.requests, "instances": args.instances, "seed": args.seed,
                      "routing_instances": ROUTING_INSTANCES,
                      "routing_repeats": ROUTING_REPEATS, "profile": "qwen3-8b@a100",
                      "method": "rcllm", "policy": "affinity"}, rows, summary)
        print(f"wrote {args.json}")
    return 0


def _add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument("--instances", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="write the report (reporting contract)")
    p.set_defaults(func=_bench)


def register(top, bench) -> None:
    sim = top.add_parser("sim", help="cluster simulator: experiments, validation, speed")
    sub = sim.add_subparsers(dest="sim_command", metavar="SIM")
    sim.set_defaults(func=lambda _a: (sim.print_help(), 2)[1])
    _run_parser(sub)
    _validate_parser(sub)
    _sweep_parser(sub)
    _map_parser(sub)
    prof = sub.add_parser("profiles", help="GPU speed profiles fitted from vidur timings")
    from ..routing.vidur_fit import DEFAULT_DIR
    prof.add_argument("--vidur-dir", default=os.path.normpath(DEFAULT_DIR))
    prof.set_defaults(func=_profiles)
    _add_bench_args(sub.add_parser("bench", help="simulator and routing speed"))
    _add_bench_args(bench.add_parser("sim", help="simulator and routing speed"))


def _run_parser(sub) -> None:
    run = sub.add_parser("run", help="run a paper experiment; writes JSON + PNG + markdown")
    run.add_argument("experiment", choices=EXPERIMENTS + ("all",))
    run.add_argument("--out", default="sim-out")
    run.add_argument("--requests", type=int, default=10_000)
    run.add_argument("--items", type=int, default=100_000, help="synthetic catalogue size")
    run.add_argument("--profile", default="qwen3-8b@a100",
                     help="qwen3-8b@a100|qwen3-8b@h100|qwen-72b@a100|qwen-72b@h100, or a "
                          "profile file (.json) from `bench shapes --profile-out` or "
                          "`serve --save-profile`")
    run.add_argument("--placement", choices=("community", "hash", "metis"), default=None)
    run.add_argument("--load", type=float, default=0.7,
                     help="offered load relative to Prefix-Cache capacity")
    run.add_argument("--hot-fraction", type=float, default=0.001,
                     help="share of items replicated on every instance")
    run.add_argument("--item-ratio", type=float, default=0.3)
    run.add_argument("--history-ratio", type=float, default=0.3)
    run.add_argument("--data", default="", help="real trace path (with --format)")
    run.add_argument("--format", default="", help="dataset format, e.g. amazon2018")
    run.add_argument("--candidate-source", choices=("popularity", "retrieval"),
                     default="popularity",
                     help="real traces: popularity-sampled negatives (default) or the item-kNN "
                          "retriever's shortlist")
    run.add_argument("--zipf-alpha", type=float, default=1.0,
                     help="synthetic catalogue: item k drawn with weight 1/k^alpha (default 1)")
    run.add_argument("--zipf-from", default="", metavar="PATH:FORMAT[:CATEGORY]",
                     help="synthetic catalogue: alpha fitted on a real catalogue's long tail")
    run.add_argument("--ks", default="1,2,5,10,20,40,70,100",
                     help="scaling: the instance counts (comma-separated)")
    run.add_argument("--policy-instances", type=int, default=10,
                     help="policy: the instance count (default 10)")
    run.add_argument("--seed", type=int, default=0)
    run.set_defaults(func=_run)


def _validate_parser(sub) -> None:
    val = sub.add_parser("validate", help="cost-model error against `rcllm bench ttft --json`")
    val.add_argument("--bench-json", required=True,
                     help="the run whose TTFTs are predicted; comma-separated repeated runs of "
                          "the same requests are merged (per request and variant, the fastest)")
    val.add_argument("--fit-json", default="",
                     help="fit the profile on this other run (same comma syntax; default: "
                          "split-half of --bench-json)")
    val.add_argument("--min-repeats", type=int, default=1,
                     help="keep only requests measured in at least this many of the merged runs")
    val.add_argument("--json", default="", help="write the report here")
    val.add_argument("--seed", type=int, default=0)
    val.add_argument("--no-speed-reference", action="store_true",
                     help="--fit-json: do not scale each run's times by its speed reference "
                          "(bench ttft's reference passes; scaled by default when every run "
                          "has them)")
    val.set_defaults(func=_validate)


def _sweep_parser(sub) -> None:
    sw = sub.add_parser("sweep", help="predict a `rcllm bench serve --sweep` run cell by cell "
                                      "with a profile fitted on a separate `bench ttft` run")
    sw.add_argument("--sweep-json", required=True, help="the sweep's sweep.json")
    sw.add_argument("--fit-json", required=True,
                    help="bench ttft --json run(s) to fit the profile on (comma-separated "
                         "repeats merged as in validate); never the sweep itself")
    sw.add_argument("--min-repeats", type=int, default=1)
    sw.add_argument("--routing", choices=("replay", "policy", "caches"), default="replay",
                    help="replay the served router's choices (default); simulate load-only "
                         "and round-robin (policy; the others replayed); or simulate every "
                         "policy on simulated stores, hits and imports included (caches: a "
                         "sweep without the shared tier; it predicts the hit ratios too)")
    sw.add_argument("--store-bytes", type=int, default=None, metavar="B",
                    help="with --routing caches: replay the stores at budget B instead of the "
                         "sweep's (a what-if: the measured columns stay the sweep's)")
    sw.add_argument("--no-imports", action="store_true",
                    help="with --routing caches: replay without item KV moved between "
                         "instances (a what-if: a miss is computed where the request runs)")
    sw.add_argument("--overhead-ms", type=float, default=0.0,
                    help="HTTP + router time added to every request (default 0)")
    sw.add_argument("--busy-slowdown", type=float, default=1.0, metavar="F",
                    help="while two or more instances compute at once each runs at 1/F of its "
                         "speed alone (default 1: independent instances)")
    sw.add_argument("--busy-from", metavar="ALONE,SHARED",
                    help="measure F instead, per engine method: two bench ttft --json runs "
                         "of the same requests, one alone, one with a second copy running "
                         "beside it (the median ratio of their TTFTs); never the sweep")
    sw.add_argument("--no-behind", action="store_true",
                    help="leave out the work each answer queues behind it (chunk builds, the "
                         "exact user side), which by default runs beside the engines on the "
                         "sweep machine's cores")
    sw.add_argument("--served-from", metavar="SWEEP_JSON",
                    help="measure F on a separate served run instead (another bench serve "
                         "--sweep's sweep.json, never the one predicted, e.g. the serve-calib "
                         "stage of scripts/reproduce_tables.sh): per method the median engine "
                         "thread CPU per request over the profile's price")
    sw.add_argument("--served-weight", action="store_true",
                    help="with --served-from: also take the builder threads' CPU weight against "
                         "an engine from that run (the weight at which its replay gives the "
                         "engine time it measured) instead of CFS's weight of their niceness")
    ref = sw.add_mutually_exclusive_group()
    ref.add_argument("--speed-reference", dest="speed_reference", action="store_true",
                     help="scale each cell by its speed reference over the fit run's (the "
                          "128-token pass both time). Off by default: over nine whole sweeps "
                          "it put fewer cells within 15%% than leaving it out (61 vs 72 of 144; "
                          "88 vs 97 with --busy-from; docs/simulator.md)")
    ref.add_argument("--no-speed-reference", dest="speed_reference", action="store_false",
                     help="do not scale the cells (the default)")
    sw.add_argument("--service", choices=("profile", "measured"), default="profile",
                    help="what a request's engine time is: the fitted profile's price "
                         "(default), or the engine TTFT the sweep measured for it (the "
                         "queueing model with a perfect cost model: what is left of the error "
                         "is not the cost model's)")
    sw.add_argument("--out", default="sim-sweep", help="output folder (default sim-sweep)")
    sw.set_defaults(func=_sweep)
