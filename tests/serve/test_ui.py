"""Issue 19: /v1/rank's explain option, /v1/ui/users and the page at /ui, over a real server
(tiny model, synthetic dataset, a bearer token); the page is driven in headless Chromium
(Debian's chromium + chromium-driver via selenium) and a screenshot is written."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import httpx
import pytest

from rcllm.config import RcllmConfig
from rcllm.engine import SOURCES, Engine
from rcllm.serve.app import create_app
from rcllm.serve.local import LocalBackend
from rcllm.serve.server import start_in_thread
from rcllm.serve.settings import ServeSettings
from rcllm.serve.ui import compare

from serve_helpers import serve_process

TOKEN = "ui-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def ui_server(tiny_loaded, synthetic):
    engine = Engine(tiny_loaded, dict(synthetic.items), RcllmConfig())
    backend = LocalBackend(engine, queue_size=2)
    running = start_in_thread(create_app(backend, ServeSettings(queue_size=2, token=TOKEN),
                                         dataset=synthetic))
    yield running.url
    running.stop()


@pytest.fixture(scope="module")
def users(ui_server):
    with httpx.Client(base_url=ui_server, timeout=120) as c:
        assert c.get("/v1/ui/users").status_code == 401
        r = c.get("/v1/ui/users", headers=AUTH)
        assert r.status_code == 200, r.text
        return r.json()


def test_compare_rank_changes_kl_and_top1():
    same = compare(["a", "b"], {"a": 2.0, "b": 1.0}, ["a", "b"], {"a": 2.0, "b": 1.0},
                   ["a", "b"])
    assert same["kl"] == pytest.approx(0.0, abs=1e-12) and same["top1_agree"] is True
    flip = compare(["b", "a", "c"], {"a": 1.0, "b": 2.0, "c": 0.0}, ["a", "c", "b"],
                   {"a": 3.0, "b": 0.0, "c": 1.0}, ["a", "b", "c"])
    assert [(r["item_id"], r["rank_change"]) for r in flip["rows"]] == \
        [("b", 2), ("a", -1), ("c", -1)]
    p = [math.exp(x) for x in (3.0, 0.0, 1.0)]
    q = [math.exp(x) for x in (1.0, 2.0, 0.0)]
    p, q = [x / sum(p) for x in p], [x / sum(q) for x in q]
    assert flip["kl"] == pytest.approx(sum(a * math.log(a / b) for a, b in zip(p, q)))
    assert flip["top1_agree"] is False
    alone = compare(["a"], {"a": 1.0}, None, None, ["a"])
    assert alone["kl"] is None and alone["rows"][0]["full_rank"] is None


def test_explain_needs_the_engine_in_this_process():
    import asyncio

    from rcllm.errors import RcllmError
    from rcllm.serve.ui import rank_explained

    with pytest.raises(RcllmError, match="single-process"):
        asyncio.run(rank_explained(object(), {}))          # e.g. the Ray backend


def test_page_shell_is_open_and_data_needs_the_token(ui_server, users):
    with httpx.Client(base_url=ui_server, timeout=60) as c:
        page = c.get("/ui")
        assert page.status_code == 200 and "/ui/static/ui.js" in page.text
        for name in ("ui.css", "ui.js"):
            assert c.get(f"/ui/static/{name}").status_code == 200
        assert c.get("/ui/static/other.txt").status_code in (401, 404)
        body = {**users["users"][0]["request"], "explain": True}
        assert c.post("/v1/rank", json=body).status_code == 401
    assert "rcllm" in users["methods"] and users["explain"] is True
    assert len(users["users"]) > 5
    for u in users["users"]:
        assert u["target"] in u["request"]["candidates"]
        assert u["request"]["user_id"] == u["user_id"]


def test_rank_explain_with_full_comparison(ui_server, users):
    body = users["users"][1]["request"]
    with httpx.Client(base_url=ui_server, timeout=120, headers=AUTH) as c:
        plain = c.post("/v1/rank", json={**body, "method": "naive"})   # chunk misses stored
        assert plain.status_code == 200 and plain.json()["explain"] is None
        r = c.post("/v1/rank", json={**body, "method": "rcllm", "item_ratio": 0.3,
                                     "explain": True, "compare": True})
        assert r.status_code == 200, r.text
        out = r.json()
        full = c.post("/v1/rank", json={**body, "method": "full"}).json()
    ex = out["explain"]
    toks = ex["tokens"]
    assert len(toks) == out["stats"]["tokens"]
    assert {t["source"] for t in toks} <= set(SOURCES) and ex["sources"] == list(SOURCES)
    assert {"chunk", "fresh"} <= {t["source"] for t in toks}          # items came from the store
    assert any(t["recomputed"] for t in toks)
    assert all(t["source"] != "fresh" for t in toks if t["recomputed"])
    assert {"id", "text", "kind", "block", "layers", "deviation", "attention"} <= set(toks[0])
    assert sorted(ex["candidates"]) == sorted(body["candidates"])
    assert set(ex["timing_ms"]) == {"build", "lookups_and_gather", "layer0_and_selection",
                                    "selective_layers", "scoring"}
    assert set(ex["titles"]) == set(body["candidates"])
    assert [r["item_id"] for r in ex["rows"]] == out["ranking"]
    assert ex["full"]["ranking"] == full["ranking"]
    for row in ex["rows"]:
        assert row["full_score"] == pytest.approx(full["scores"][row["item_id"]], abs=1e-4)
        assert row["rank_change"] == row["full_rank"] - row["rank"]
    assert ex["kl"] >= 0 and ex["top1_agree"] == (out["ranking"][0] == full["ranking"][0])


def test_explain_of_the_pointwise_scorer_has_candidate_blocks(tiny_loaded, synthetic, users):
    from rcllm.serve.host import EngineHost
    from rcllm.serve.ui import explained

    host = EngineHost(Engine(tiny_loaded, dict(synthetic.items), RcllmConfig(),
                             scorer="pointwise"))
    try:
        body = users["users"][3]["request"]
        host.rank({**body, "method": "naive"})             # user side and item chunks cached
        out = explained(host, {**body, "method": "rcllm", "compare": True})
    finally:
        host.close()
    ex = out["explain"]
    blocks = {t["block"] for t in ex["tokens"]}
    assert blocks == set(range(len(body["candidates"]) + 1))
    sources = {t["source"] for t in ex["tokens"] if t["block"] == 0}
    assert sources & {"user_prefix", "prefix"}
    assert len(ex["rows"]) == len(body["candidates"]) and ex["kl"] >= 0


def test_rcllm_serve_lists_its_dataset_users(tiny_model_dir):
    with serve_process("--set", f"model.path={tiny_model_dir}",
                       "--set", "model.threads=1") as (url, _proc):
        users = httpx.get(f"{url}/v1/ui/users", timeout=60).json()
        assert httpx.get(f"{url}/ui").status_code == 200
    assert len(users["users"]) > 5 and users["explain"] is True


# ---- the page in a real browser ------------------------------------------------------------
def chromium_driver():
    """A headless Chromium at 1280x800 (Debian's chromium + chromium-driver, installed by
    `scripts/setup.sh --dev`); a failure that says what is missing otherwise."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.fail("no browser: needs Debian's chromium and chromium-driver "
                    "(bash scripts/setup.sh --dev installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    opts = Options()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,800", "--hide-scrollbars"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


def test_page_in_headless_chromium(ui_server, users, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    body = users["users"][2]["request"]
    with httpx.Client(base_url=ui_server, timeout=120, headers=AUTH) as c:   # item KV stored
        assert c.post("/v1/rank", json={**body, "method": "naive"}).status_code == 200
    drv = chromium_driver()
    try:
        drv.set_window_size(1280, 800)
        drv.get(ui_server + "/ui")
        wait = WebDriverWait(drv, 120)
        wait.until(lambda d: "401" in d.find_element(By.ID, "status").text)  # no token yet
        # keyboard only: type the token, Tab to "Load users", press Enter
        drv.find_element(By.ID, "token").send_keys(TOKEN, Keys.TAB, Keys.ENTER)
        wait.until(lambda d: len(Select(d.find_element(By.ID, "user")).options) > 1)
        Select(drv.find_element(By.ID, "user")).select_by_value("2")
        Select(drv.find_element(By.ID, "method")).select_by_value("rcllm")
        drv.find_element(By.ID, "item-ratio").send_keys("0.3", Keys.ENTER)   # submits
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#ranking tbody tr"))
                   == len(body["candidates"]))
        toks = drv.find_elements(By.CSS_SELECTOR, "#prompt .t")
        assert len(toks) > 50
        classes = drv.execute_script(
            "return [...document.querySelectorAll('#prompt .t')].map(e => e.className)")
        assert any("s-chunk" in k for k in classes) and any("s-fresh" in k for k in classes)
        assert any(" rc" in k for k in classes)
        colours = drv.execute_script(
            "return [...new Set([...document.querySelectorAll('#prompt .t')]"
            ".map(e => getComputedStyle(e).backgroundColor))]")
        assert len(colours) >= 2                       # sources are coloured differently
        agreement = drv.find_element(By.ID, "agreement").text
        assert "KL" in agreement and "top-1" in agreement
        assert len(drv.find_elements(By.CSS_SELECTOR, "#ttft > div")) == 5
        # token details from the keyboard: focus the prompt, move with the arrows
        drv.execute_script("document.getElementById('prompt').focus()")
        drv.find_element(By.ID, "prompt").send_keys(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT)
        assert drv.find_element(By.ID, "token-info").text.startswith("token 2 ")
        end = [Keys.END] + [Keys.ARROW_LEFT] * 3
        drv.find_element(By.ID, "prompt").send_keys(*end)
        assert "deviation" in drv.find_element(By.ID, "token-info").text
        # readable at 1280x800: nothing wider than the window
        assert drv.execute_script("return document.documentElement.scrollWidth") <= 1280
        # the screenshot: the first recomputed token selected, the prompt scrolled to it
        drv.execute_script("""
            const p = document.getElementById('prompt');
            const t = p.querySelector('.t.rc');
            t.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
            p.scrollTop = Math.max(0, t.offsetTop - p.offsetTop - 40);
            window.scrollTo(0, 0); document.activeElement.blur();""")
        assert "RECOMPUTED" in drv.find_element(By.ID, "token-info").text
        shot = Path(os.environ.get("RCLLM_UI_SCREENSHOT") or tmp_path / "ui.png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        assert drv.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    finally:
        drv.quit()
