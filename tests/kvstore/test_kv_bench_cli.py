import json

from rcllm.cli import main


def test_bench_kvstore_reports_every_tier(tmp_path):
    out = tmp_path / "kv.json"
    assert main(["bench", "kvstore", "--layers", "2", "--kv-heads", "1", "--head-dim", "8",
                 "--tokens", "16", "--entries", "3", "--recompute-ms-per-token", "0.5",
                 "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    tiers = {(r["tier"], r["op"]) for r in report["rows"]}
    assert {("memcpy", "copy"), ("memory", "get"), ("disk-raw", "get"), ("disk-int8", "put")} <= tiers
    summary = report["summary"]
    assert summary["recompute_ms"] == 8.0 and summary["entry_bytes"] == 2 * 2 * 16 * 8 * 4
    assert 0.0 < summary["int8_saved_fraction"] < 1.0
    assert all(r["recompute_over_fetch"] is not None for r in report["rows"] if r["op"] == "get")
    int8 = next(r for r in report["rows"] if r["tier"] == "disk-int8")
    raw = next(r for r in report["rows"] if r["tier"] == "disk-raw")
    assert int8["stored_bytes"] < raw["stored_bytes"]
