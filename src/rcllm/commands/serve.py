"""`rcllm serve`: the HTTP API on 127.0.0.1, one engine in this process or K Ray instances."""

from __future__ import annotations

import argparse
import logging
import os

from ..errors import RcllmError
from ..report import UNTUNED_NOTE

log = logging.getLogger(__name__)


def register(top, bench) -> None:
    from .common import add_engine_options
    from ..serve.settings import ServeSettings

    d = ServeSettings()
    p = top.add_parser("serve", help="serve the ranking API over HTTP (127.0.0.1 by default)",
                       formatter_class=argparse.RawTextHelpFormatter)
    add_engine_options(p)
    p.add_argument("--data", metavar="PATH",
                   help="dataset whose items form the catalog (default: built-in synthetic)")
    p.add_argument("--format", default="amazon2018", help="dataset format (default amazon2018)")
    p.add_argument("--category", help="category when --data is an Amazon folder")
    p.add_argument("--host", default=d.host, help=f"address to bind (default {d.host})")
    p.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port})")
    p.add_argument("--queue-size", type=int, default=d.queue_size,
                   help=f"requests admitted per instance before 429 (default {d.queue_size})")
    p.add_argument("--max-candidates", type=int, default=d.max_candidates,
                   help=f"candidates per request (default {d.max_candidates})")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help=f"largest request body (default {d.max_body_bytes})")
    p.add_argument("--token-env", metavar="VAR",
                   help="require `Authorization: Bearer <token>` with the token read from this "
                        "environment variable (a token is never passed on the command line)")
    p.add_argument("--adapter", metavar="PATH",
                   help="LoRA adapter from `rcllm finetune`: sets model.adapter and adopts its "
                        "prompt settings, scorer and default method")
    p.add_argument("--scorer", choices=("verbalizer", "likelihood", "pointwise"),
                   help="default: the adapter's, else verbalizer")
    _store_options(p)
    p.add_argument("--build-items", action="store_true",
                   help="single process: build every catalog item's KV before serving")
    _cluster_options(p)
    p.set_defaults(func=run)
    if bench is not None:
        from .bench_serve import register_bench

        register_bench(bench)


def _store_options(p) -> None:
    """The KV tiers and the user-prefix cache."""
    p.add_argument("--history-kv-bytes", type=int, default=1 << 30, metavar="N",
                   help="memory budget of review (history) chunk KV, apart from the item KV "
                        "budget reuse.store_bytes, so client reviews cannot evict catalog items "
                        "(default 1 GiB)")
    p.add_argument("--redis", metavar="URL",
                   help="Redis tier below memory (and --kv-dir): redis://HOST[:PORT]; shared "
                        "by every instance; an unreachable server is a miss, never an error")
    p.add_argument("--redis-local", action="store_true",
                   help="start a private redis-server on loopback for this process (stopped "
                        "on exit) and use it as the Redis tier")
    p.add_argument("--kv-encoding", choices=("raw", "int8"), default="raw",
                   help="encoding of the disk and Redis tiers (int8: ~4x smaller, lossy)")
    p.add_argument("--userprefix-bytes", type=int, metavar="N",
                   help="pointwise scorer: byte budget of the user-prefix cache "
                        "(= --set userprefix.max_bytes=N; default 1 GiB)")
    p.add_argument("--userprefix-ttl", type=float, metavar="S",
                   help="pointwise scorer: user-side TTL in seconds (= --set "
                        "userprefix.ttl_s=S; default 0 = adaptive, at most "
                        "userprefix.max_ttl_s)")
    p.add_argument("--userprefix-int8", action="store_true",
                   help="pointwise scorer: keep user sides as INT8 K/V (~4x smaller; "
                        "= --set userprefix.int8=true)")
    p.add_argument("--userprefix-spill-bytes", type=int, metavar="N",
                   help="pointwise scorer: host spill tier for evicted user sides (= --set "
                        "userprefix.spill_bytes=N; default 0 = off)")


def _cluster_options(p) -> None:
    """Ray instances behind the router."""
    from ..routing.registry import DEFAULT_POLICY, POLICIES

    p.add_argument("--instances", type=int, default=1,
                   help="K > 1: K Ray instance actors behind a router (default 1: no Ray)")
    p.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=POLICIES,
                   help=f"routing policy with --instances (default {DEFAULT_POLICY})")
    p.add_argument("--profile", default="calibrate", metavar="calibrate|builtin|PATH",
                   help="speed profile the router prices requests with (--instances): "
                        "calibrate = fitted to 12 timed rankings of the served model on "
                        "instance 0 at start (default); builtin = the unfitted SmolLM2 CPU "
                        "profile; PATH = a profile saved by --save-profile")
    p.add_argument("--save-profile", metavar="PATH",
                   help="write the profile the router uses to PATH (JSON), for --profile PATH")
    add_placement_options(p)


def add_placement_options(p) -> None:
    """Where item KV is placed at start and how affinity weighs load (`serve` and the sweep)."""
    p.add_argument("--placement", choices=("metis", "random"), default="metis",
                   help="--instances: shard the catalog's tail by METIS over the co-occurrence "
                        "of the users' histories (default), or at random with METIS's hot "
                        "items and shard sizes (seeded): the baseline METIS is compared with")
    p.add_argument("--placement-seed", type=int, default=0,
                   help="seed of --placement random (default 0)")
    p.add_argument("--affinity-idle-weight", type=idle_weight_arg, default="derived",
                   metavar="derived|W",
                   help="affinity's idleness weight: derived (default) = from the router's "
                        "cost model at each decision (the misses' recompute time against the "
                        "queue wait; routing/balance.py), or a fixed number (4: the weight "
                        "tuned on 40 simulated instances)")
    p.add_argument("--no-imports", action="store_true",
                   help="--instances without a shared tier: never move item KV between "
                        "instances, a miss is computed where the request runs (default: "
                        "exported by an instance that holds it while the request queues, when "
                        "the cost model prices that below recomputing; serve/imports.py)")


def idle_weight_arg(text: str) -> str | float:
    """'derived' or a weight >= 0 (argparse type)."""
    if text == "derived":
        return text
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: use derived or a number >= 0")
    return value


def settings_from(args):
    from ..serve.settings import ServeSettings

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise RcllmError(f"--token-env: ${args.token_env} is empty or unset")
    s = ServeSettings(host=args.host, port=args.port, queue_size=args.queue_size,
                      max_body_bytes=args.max_body_bytes, max_candidates=args.max_candidates,
                      token=token)
    s.validate()
    return s


def userprefix_overrides(args) -> list[str]:
    """The `--userprefix-*` options as `--set` strings (they come after the user's own --set,
    so the option wins)."""
    out = []
    for flag, key in (("userprefix_bytes", "max_bytes"), ("userprefix_ttl", "ttl_s"),
                      ("userprefix_spill_bytes", "spill_bytes")):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"userprefix.{key}={value}")
    if getattr(args, "userprefix_int8", False):
        out.append("userprefix.int8=true")
    return out


def spec_from(args):
    """The EngineSpec of the arguments (checked: a bad option is refused before anything
    starts)."""
    from ..serve.spec import EngineSpec

    if args.history_kv_bytes < 1:
        raise RcllmError("--history-kv-bytes must be positive")
    if getattr(args, "redis", None):
        from ..kvstore.wiring import parse_redis_url

        parse_redis_url(args.redis)          # a bad URL is refused before anything starts
    overrides = (*args.overrides, *userprefix_overrides(args))
    spec = EngineSpec(args.config, overrides, args.data, args.format, args.category,
                      args.kv_dir, args.adapter, args.scorer, args.history_kv_bytes,
                      getattr(args, "redis", None), getattr(args, "kv_encoding", "raw"))
    spec.engine_config()                     # validates the config (userprefix.* included)
    return spec


def make_backend(args):
    """The backend the arguments ask for: LocalBackend, or RayBackend with --instances > 1."""
    if getattr(args, "no_imports", False) and args.instances <= 1 and not args.address:
        raise RcllmError("--no-imports is about moving item KV between instances: it needs "
                         "--instances K > 1 (or --address)")
    spec = spec_from(args)
    if args.instances > 1 or args.address:
        try:
            from ..serve.router import RayBackend
        except ImportError as exc:
            raise RcllmError(f"--instances needs ray ({exc}); pip install ray") from None
        profile = getattr(args, "profile", "calibrate")
        if profile not in ("calibrate", "builtin"):
            from ..serve.calibrate import load_profile

            profile = load_profile(profile)     # a bad file is refused before Ray starts
        weight = getattr(args, "affinity_idle_weight", "derived")
        return RayBackend(spec, args.instances, args.queue_size, args.policy, args.address,
                          profile=profile, save_profile_to=getattr(args, "save_profile", None),
                          placement=getattr(args, "placement", "metis"),
                          placement_seed=getattr(args, "placement_seed", 0),
                          w_idle=None if weight == "derived" else float(weight),
                          fetch_remote=not getattr(args, "no_imports", False))
    from ..serve.local import LocalBackend

    engine, ds = spec.build()
    if args.build_items:
        engine.build_items(list(ds.items), progress=True)
    backend = LocalBackend(engine, args.queue_size)
    backend.dataset = ds                     # the users the page at /ui lists (serve/ui.py)
    return backend


def run(args) -> int:
    from ..serve import lifecycle

    with lifecycle.stop_signals_exit():       # SIGTERM / SIGHUP stop Redis and Ray too
        return _run(args)


def _run(args) -> int:
    import uvicorn

    from ..serve import lifecycle
    from ..model.adapter_file import ranks_untuned
    from ..serve.app import create_app
    from ..serve.server import KEEP_ALIVE_S

    settings = settings_from(args)
    if settings.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: reachable beyond this machine", settings.host)
    redis = None
    if args.redis_local:
        if args.redis:
            raise RcllmError("--redis and --redis-local contradict each other")
        from ..kvstore.redis_server import RedisServer

        redis = RedisServer().start()
        args.redis = f"redis://127.0.0.1:{redis.port}"
        print(f"private redis-server on {args.redis} (stopped on exit)")
    try:
        backend = make_backend(args)
        lifecycle.install()                  # ray.init put its own SIGTERM handler in place
        # no adapter (or one that learnt nothing): the start-up log, /healthz and the page say
        # the rankings are untuned
        untuned = ranks_untuned(spec_from(args).engine_config()[0].model.adapter)
        app = create_app(backend, settings, dataset=getattr(backend, "dataset", None),
                         untuned=untuned)
        if untuned:
            print(f"note: {UNTUNED_NOTE}")
        print(f"rcllm serving on http://{settings.host}:{settings.port} (docs at /docs, "
              f"explain page at /ui)")
        # uvicorn stops gracefully on SIGINT/SIGTERM (closing the backend: Ray's actors and
        # processes), then raises the signal again under our handler: SystemExit, so the
        # finally below runs
        uvicorn.run(app, host=settings.host, port=settings.port, log_level="info",
                    timeout_keep_alive=KEEP_ALIVE_S)
    finally:
        if redis is not None:
            redis.stop(graceful=True)
    return 0
