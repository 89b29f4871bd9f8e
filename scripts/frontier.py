"""The speed–fidelity frontier of one dataset's adapter (issue 50, item 6): one PNG and one
table from the reports of `rcllm eval` (quality, paired Δ vs full, agreement, user-swap drop)
and `rcllm bench ttft` (TTFT speed-up over full on a user-prefix miss and with it cached;
with an `exact-user` row, the lossless peer drawn at Δ 0 and each path's cached speed over it).

    python scripts/frontier.py --name Magazine --eval EVAL.json [EVAL2.json ...] \
        --ttft TTFT.json [TTFT2.json ...] --png OUT.png [--md OUT.md]

Rows are matched by variant label. `late` rows are labelled `late@s` with the report's
`reuse.late_layer` (a bench or eval run with `--set reuse.late_layer=s` gives one s each), and
rcllm rows carry their selection (`reuse.rcllm_select`) when it is not the default blend.
Reads only the reports; runs no model.
"""

from __future__ import annotations

import argparse
import json


def _label(row: dict, reuse: dict) -> str:
    v = row["variant"]
    hit = v.endswith(" +user prefix")
    base = v[: -len(" +user prefix")] if hit else v
    if base == "late":
        base = f"late@{reuse.get('late_layer', 20)}"
    if row.get("method") == "rcllm" and reuse.get("rcllm_select", "blend") != "blend":
        base += f" ({reuse['rcllm_select']})"
    return base + (" +user prefix" if hit else "")


def _reuse(report: dict) -> dict:
    cfg = report.get("config", {})
    engine = cfg.get("engine", cfg)
    return engine.get("reuse", {}) if isinstance(engine, dict) else {}


def load(paths: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for p in paths:
        with open(p) as f:
            rep = json.load(f)
        reuse = _reuse(rep)
        for row in rep["rows"]:
            out.setdefault(_label(row, reuse), row)
    return out


def table(quality: dict[str, dict], speed: dict[str, dict]) -> list[dict]:
    rows = []
    for lab, q in quality.items():
        if "ndcg@10_delta_vs_full" not in q or lab.endswith("_user_swapped") or \
                lab in ("full_reordered", "full_content_swapped"):
            continue
        swap = quality.get(f"{q['variant']}_user_swapped", {})
        miss, hit = speed.get(lab, {}), speed.get(lab + " +user prefix", {})
        rows.append({
            "method": lab, "ndcg@10": q["ndcg@10"], "delta": q["ndcg@10_delta_vs_full"],
            "delta_low": q["ndcg@10_delta_vs_full_ci_low"],
            "delta_high": q["ndcg@10_delta_vs_full_ci_high"],
            "top1": q.get("top1_agreement"), "top5": q.get("top5_overlap"),
            "swap_drop": swap.get("user_swap_drop"),
            "speedup_miss": miss.get("speedup_vs_full"),
            "speedup_hit": hit.get("speedup_vs_full")})
    return with_exact_user(rows, speed.get("exact-user"))


def with_exact_user(rows: list[dict], peer: dict | None) -> list[dict]:
    """The lossless peer of a cached user side as a point at Δ 0 (tests pin it to full), and
    every row's cached speed-up over it (None without an exact-user row in the bench)."""
    base = peer.get("speedup_vs_full") if peer else None
    for r in rows:
        r["vs_exact_user"] = r["speedup_hit"] / base if base and r["speedup_hit"] else None
    if base:
        rows.append({"method": "exact-user", "ndcg@10": None, "delta": 0.0, "delta_low": 0.0,
                     "delta_high": 0.0, "top1": 1.0, "top5": 1.0, "swap_drop": None,
                     "speedup_miss": None, "speedup_hit": base, "vs_exact_user": 1.0})
    return rows


def markdown(rows: list[dict]) -> str:
    def f(x, spec=".3f"):
        return "—" if x is None else format(x, spec)

    out = ["| method | NDCG@10 | Δ vs full [paired 95% CI] | top-1 / top-5 agreement | "
           "user-swap drop | TTFT speed-up, miss / user side cached | cached × exact-user |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['method']} | {f(r['ndcg@10'])} | {f(r['delta'], '+.3f')} "
                   f"[{f(r['delta_low'], '+.3f')}, {f(r['delta_high'], '+.3f')}] | "
                   f"{f(r['top1'], '.2f')} / {f(r['top5'], '.2f')} | {f(r['swap_drop'], '+.3f')} "
                   f"| {f(r['speedup_miss'], '.2f')}× / {f(r['speedup_hit'], '.2f')}× "
                   f"| {f(r['vs_exact_user'], '.2f')}× |")
    return "\n".join(out)


def plot(rows: list[dict], name: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        for key, marker in (("speedup_miss", "o"), ("speedup_hit", "s")):
            if r[key] is None:
                continue
            ax.errorbar(r[key], r["delta"], yerr=[[r["delta"] - r["delta_low"]],
                                                  [r["delta_high"] - r["delta"]]],
                        marker=marker, capsize=2, color="tab:blue" if key == "speedup_miss"
                        else "tab:green", alpha=0.8)
            ax.annotate(r["method"], (r[key], r["delta"]), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    peer = next((r["speedup_hit"] for r in rows if r["method"] == "exact-user"), None)
    if peer:  # a fast path earns its place right of this line, at parity
        ax.axvline(peer, color="tab:red", ls="--", lw=0.8)
    ax.axhline(0, color="grey", lw=0.8)
    ax.axhline(-0.02, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("TTFT speed-up over full (circles: user-prefix miss, squares: cached)")
    ax.set_ylabel("ΔNDCG@10 vs full (paired 95% CI)")
    ax.set_title(f"{name}: speed–fidelity frontier")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--eval", nargs="+", required=True)
    ap.add_argument("--ttft", nargs="+", required=True)
    ap.add_argument("--png", required=True)
    ap.add_argument("--md")
    args = ap.parse_args()
    rows = table(load(args.eval), load(args.ttft))
    md = markdown(rows)
    print(md)
    plot(rows, args.name, args.png)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md + "\n")


if __name__ == "__main__":
    main()
