"""`rcllm serve` as a process: it starts on loopback with the given model and answers."""

from __future__ import annotations

import argparse

import httpx
import pytest

from rcllm.errors import RcllmError
from rcllm.commands.serve import register, settings_from

from serve_helpers import serve_process


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    top = p.add_subparsers()
    bench = top.add_parser("bench").add_subparsers()
    register(top, bench)
    return p


def test_options_and_token_from_environment(monkeypatch):
    args = _parser().parse_args(["serve", "--token-env", "RCLLM_TEST_TOKEN"])
    assert args.host == "127.0.0.1" and args.instances == 1 and args.policy == "affinity"
    with pytest.raises(RcllmError):
        settings_from(args)
    monkeypatch.setenv("RCLLM_TEST_TOKEN", "t0k")
    assert settings_from(args).token == "t0k"
    assert _parser().parse_args(["bench", "serve"]).qps > 0


def test_serve_process_answers_on_loopback(tiny_model_dir):
    with serve_process("--set", f"model.path={tiny_model_dir}",
                       "--set", "model.threads=1") as (url, _proc):
        schema = httpx.get(f"{url}/openapi.json").json()
    assert {"/v1/rank", "/v1/prewarm", "/v1/items", "/v1/items/{item_id}",
            "/metrics"} <= set(schema["paths"])


def test_userprefix_options_reach_the_engine_config():
    from rcllm.commands.serve import spec_from

    args = _parser().parse_args(["serve", "--scorer", "pointwise", "--userprefix-int8",
                                 "--userprefix-ttl", "30", "--userprefix-bytes", "1000000",
                                 "--userprefix-spill-bytes", "5000",
                                 "--set", "userprefix.ttl_s=5"])
    cfg, scorer = spec_from(args).engine_config()
    up = cfg.userprefix
    assert scorer == "pointwise"
    assert (up.int8, up.ttl_s, up.max_bytes, up.spill_bytes) == (True, 30.0, 1_000_000, 5000)
    defaults = spec_from(_parser().parse_args(["serve"])).engine_config()[0].userprefix
    assert (defaults.int8, defaults.ttl_s) == (False, 0.0)
    with pytest.raises(RcllmError, match="userprefix"):
        spec_from(_parser().parse_args(["serve", "--userprefix-bytes", "0"]))


def test_a_bad_profile_file_is_refused_before_ray_starts(tmp_path):
    from rcllm.commands.serve import make_backend

    (tmp_path / "p.json").write_text("not json")
    args = _parser().parse_args(["serve", "--instances", "2", "--profile",
                                 str(tmp_path / "p.json")])
    assert args.save_profile is None and _parser().parse_args(["serve"]).profile == "calibrate"
    with pytest.raises(RcllmError, match="not a saved speed profile"):
        make_backend(args)


def test_no_imports_without_a_cluster_is_refused_before_anything_loads():
    from rcllm.commands.serve import make_backend

    args = _parser().parse_args(["serve", "--no-imports"])
    with pytest.raises(RcllmError, match="--no-imports"):
        make_backend(args)
    assert not _parser().parse_args(["serve", "--instances", "2"]).no_imports
