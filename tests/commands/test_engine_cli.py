"""The CLI end to end: help, clear errors without tracebacks, and the reporting contract."""

import json
import subprocess
import sys

from rcllm.cli import main


def _run(*args):
    return subprocess.run([sys.executable, "-m", "rcllm.cli", *args], capture_output=True,
                          text=True, timeout=600)


def test_help_lists_commands():
    out = _run("--help")
    assert out.returncode == 0
    for cmd in ("demo", "bench", "eval", "build-cache"):
        assert cmd in out.stdout
    bench = _run("bench", "--help")
    for cmd in ("prefill", "ttft", "checkpoints"):
        assert cmd in bench.stdout


def test_missing_weights_is_one_clear_line(tmp_path):
    out = _run("demo", "--set", f"model.path={tmp_path}/missing.gguf", "--requests", "1")
    assert out.returncode == 2
    assert "rcllm: error: model weights not found" in out.stderr
    assert "Traceback" not in out.stderr


def test_bad_option_is_one_clear_line():
    out = _run("demo", "--set", "reuse.item_ratio=7")
    assert out.returncode == 2 and "item_ratio" in out.stderr and "Traceback" not in out.stderr


def test_bench_ttft_report_contract(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "ttft.json"
    rc = main(["bench", "ttft", "--set", f"model.path={tiny_model_dir}", "--set",
               "model.threads=0", "--requests", "2", "--candidates", "5", "--json", str(path)])
    assert rc == 0
    report = json.loads(path.read_text())
    assert report["name"] == "bench_ttft"
    assert set(report) == {"name", "config", "rows", "summary"}
    keys = {"method", "item_ratio", "history_ratio", "ttft_p50_ms", "ttft_p90_ms",
            "speedup_vs_full", "speedup_vs_prefix", "recomputed_fraction",
            "flop_bound_speedup", "top1_agreement_vs_full"}
    methods = [r["method"] for r in report["rows"]]
    assert {"full", "prefix", "naive", "epic", "cacheblend", "rcllm"} <= set(methods)
    for row in report["rows"]:
        assert keys <= set(row)
    full = next(r for r in report["rows"] if r["method"] == "full")
    assert full["speedup_vs_full"] == 1.0 and full["recomputed_fraction"] == 1.0
    assert len(report["summary"]["requests"]) == 2 * len(report["rows"])
    # every chunk built ahead, timed: the simulator's price of a build behind an answer
    s = report["summary"]
    assert len(s["chunk_builds"]) == s["items_built_ahead"] + s["history_chunks_built_ahead"] > 0
    assert all(0 < n <= ctx and ms > 0 for n, ctx, ms in s["chunk_builds"])
    assert len(s["reference_ms"]) == 2 and min(s["reference_ms"]) > 0   # before and after
    # per request, the wall time and the CPU of the thread that ran it (the simulator's fits)
    assert all(0 < r["thread_cpu_ms"] and r["build_ms"] + r["assemble_ms"] < r["ttft_ms"]
               for r in report["summary"]["requests"])
    out = capsys.readouterr().out
    assert "| variant |" in out
    # no adapter: the output says the rankings are the untuned base model's
    assert report["summary"]["untuned"] is True and "ranks untuned" in out


def test_eval_report_has_references(tiny_model_dir, tmp_path):
    path = tmp_path / "eval.json"
    rc = main(["eval", "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0",
               "--requests", "2", "--candidates", "6", "--methods", "naive,rcllm",
               "--permutations", "2",
               "--json", str(path), "--plots", str(tmp_path / "plots")])
    assert rc == 0
    rows = {r["variant"]: r for r in json.loads(path.read_text())["rows"]}
    assert {"full", "full_reordered", "full_content_swapped", "naive", "rcllm 0.3/0.3"} <= set(rows)
    assert rows["full"]["kl_vs_full"] == 0.0
    for key in ("hr@10", "ndcg@10", "ndcg@10_delta_vs_full_ci_low", "kendall_tau",
                "hidden_cosine_vs_full", "ttft_p50_ms", "recomputed_fraction"):
        assert key in rows["rcllm 0.3/0.3"]
    assert rows["naive"]["recomputed_fraction"] < 1.0
    assert (tmp_path / "plots" / "ttft_cdf.png").exists()


def test_eval_html_report_renders_tokens_and_rankings(tiny_model_dir, tmp_path):
    rc = main(["eval", "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0",
               "--requests", "2", "--candidates", "5", "--methods", "rcllm",
               "--html", str(tmp_path / "report")])
    assert rc == 0
    page = (tmp_path / "report" / "report.html").read_text()
    assert "data:image/png;base64," in page                     # the TTFT CDF, embedded
    assert page.count('class="t s-chunk') > 0 and 'class="t s-prefix' in page
    assert page.count("<h3>user ") == 2 and "KL(full" in page
    assert "rcllm 0.3/0.3" in page and "http" not in page.split("<main>")[1]


def test_rank_one_request(tiny_model_dir, tmp_path, capsys):
    from rcllm.eval.datasets import load_dataset
    from rcllm.commands.common import DEFAULT_SYNTHETIC

    ds = load_dataset("", "synthetic", **DEFAULT_SYNTHETIC)
    user, hist = next(iter(ds.users.items()))
    cands = [i for i in ds.items if i not in {h.item_id for h in hist}][:4]
    req = {"user_id": user, "candidates": cands, "method": "naive",
           "history": [{"item_id": h.item_id, "rating": h.rating, "review": h.review,
                        "timestamp": h.timestamp} for h in hist[:3]]}
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    rc = main(["rank", "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0",
               "--kv-dir", str(tmp_path / "kv"), "--request", str(path)])
    out = capsys.readouterr().out
    assert rc == 0 and "method naive" in out
    assert all(c in out for c in cands)
    assert "note: no adapter (or one that learnt nothing): the base model ranks untuned" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"user_id": "u"}))
    assert _run("rank", "--request", str(bad)).stderr.strip().endswith("missing field 'candidates'")


def test_eval_user_swapped_rows(tiny_model_dir, tmp_path):
    """--user-swapped scores each path again with another user's history; the drop is the
    path's NDCG@10 minus its swapped NDCG@10 (paired)."""
    path = tmp_path / "eval.json"
    rc = main(["eval", "--set", f"model.path={tiny_model_dir}", "--set", "model.threads=0",
               "--requests", "3", "--candidates", "5", "--methods", "naive",
               "--scorer", "pointwise", "--user-swapped", "--json", str(path)])
    assert rc == 0
    rows = {r["variant"]: r for r in json.loads(path.read_text())["rows"]}
    assert {"full_user_swapped", "naive_user_swapped"} <= set(rows)
    for lab in ("full", "naive"):
        sw = rows[f"{lab}_user_swapped"]
        assert abs(sw["user_swap_drop"] - (rows[lab]["ndcg@10"] - sw["ndcg@10"])) < 1e-9
        assert sw["user_swap_drop_ci_low"] <= sw["user_swap_drop"] <= sw["user_swap_drop_ci_high"]
    assert "user_swap_drop" not in rows["full"]


def test_swap_partner_is_another_user():
    from types import SimpleNamespace as NS

    import pytest

    from rcllm.eval.runner import swap_partner

    cases = [NS(user_id=u) for u in ("a", "a", "b", "c")]
    partners = [swap_partner(cases, i) for i in range(4)]
    assert partners == [2, 2, 3, 0]
    assert all(cases[j].user_id != cases[i].user_id for i, j in enumerate(partners))
    with pytest.raises(ValueError):
        swap_partner([NS(user_id="a")] * 2, 0)
