// The page at /ui: a thin view over POST /v1/rank {explain: true} (see serve/ui.py).
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const SOURCE_TEXT = {
    fresh: "computed fresh", prefix: "prefix cache", user_prefix: "user-prefix cache",
    chunk: "chunk store", prototype: "history prototype",
  };
  const PARTS = [["build", "prompt build"], ["lookups_and_gather", "look-ups + gather"],
    ["layer0_and_selection", "layer 0 + selection"], ["selective_layers", "selective layers"],
    ["scoring", "scoring"]];
  let users = [], tokens = [], cur = -1;

  const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
  function status(msg, bad) {
    $("status").textContent = msg;
    $("status").className = bad ? "error" : "";
  }
  function headers() {
    const h = { "Content-Type": "application/json" };
    const t = $("token").value.trim();
    if (t) h.Authorization = "Bearer " + t;
    sessionStorage.setItem("rcllm-token", t);
    return h;
  }
  async function call(path, body) {
    const r = await fetch(path, body === undefined ? { headers: headers() }
      : { method: "POST", headers: headers(), body: JSON.stringify(body) });
    const data = await r.json().catch(() => ({}));
    if (!r.ok) {
      const e = data.error || {};
      throw new Error(`${r.status}: ${e.field ? e.field + ": " : ""}${e.message || r.statusText}`);
    }
    return data;
  }

  async function loadUsers() {
    try {
      const d = await call("/v1/ui/users");
      users = d.users;
      const m = $("method");
      m.textContent = "";
      for (const name of d.methods) m.add(new Option(name, name, false,
                                                     name === (d.default_method || "rcllm")));
      const u = $("user");
      u.length = 1;
      users.forEach((x, i) => u.add(new Option(
        `${x.user_id} (${x.request.history.length} reviews, ${x.request.candidates.length} candidates)`,
        String(i))));
      if (users.length && !$("json").value.trim()) { u.value = "0"; pick(); }
      status(users.length ? `${users.length} users loaded; pick one or paste a request.`
        : "No dataset users on this server: paste a request.");
      if (!d.explain) status("This backend cannot explain (Ray instances): run without --instances.", true);
      if (d.untuned) { $("untuned").textContent = d.note; $("untuned").hidden = false; }
    } catch (e) { status(e.message + (e.message.startsWith("401") ? " (enter the bearer token)" : ""), true); }
  }
  function pick() {
    const i = $("user").value;
    if (i !== "") $("json").value = JSON.stringify(users[+i].request, null, 1);
  }

  async function submit(ev) {
    ev.preventDefault();
    let body;
    try { body = JSON.parse($("json").value); } catch (e) {
      $("json-box").open = true; status("The request JSON does not parse: " + e.message, true);
      $("json").focus(); return;
    }
    body.method = $("method").value || undefined;
    for (const [id, key] of [["item-ratio", "item_ratio"], ["history-ratio", "history_ratio"]]) {
      const v = $(id).value.trim();
      if (v === "") delete body[key]; else body[key] = Number(v);
    }
    body.explain = true;
    body.compare = $("compare").checked;
    status("Ranking…");
    $("submit").disabled = true;
    try {
      const out = await call("/v1/rank", body);
      const target = users.find((u) => u.user_id === body.user_id);
      render(out, target ? target.target : null);
      status(`Ranked with ${out.method} in ${fmt(out.ttft_ms, 1)} ms TTFT.`);
    } catch (e) { status(e.message, true); }
    finally { $("submit").disabled = false; }
  }

  function render(out, target) {
    const ex = out.explain;
    tokens = ex.tokens;
    $("result").hidden = false;
    const counts = {};
    let recomputed = 0;
    for (const t of tokens) { counts[t.source] = (counts[t.source] || 0) + 1; recomputed += t.recomputed; }
    $("summary").innerHTML = "";
    $("summary").append(`method ${out.method} · ${tokens.length} tokens · ` +
      ex.sources.filter((s) => counts[s]).map((s) => `${SOURCE_TEXT[s]} ${counts[s]}`).join(", ") +
      ` · recomputed by the selection ${recomputed} · TTFT ${fmt(out.ttft_ms, 1)} ms` +
      (ex.full ? ` (full: ${fmt(ex.full.ttft_ms, 1)} ms)` : ""));
    renderTtft(ex.timing_ms);
    renderLegend(ex.sources, counts, recomputed);
    renderPrompt(ex);
    renderRanking(ex, target);
  }

  function renderTtft(timing) {
    const total = PARTS.reduce((s, [k]) => s + Math.max(0, timing[k] || 0), 0) || 1;
    const bar = $("ttft"), leg = $("ttft-legend");
    bar.textContent = ""; leg.textContent = "";
    const words = [];
    PARTS.forEach(([k, label], i) => {
      const ms = Math.max(0, timing[k] || 0);
      const seg = document.createElement("div");
      seg.className = "p" + i;
      seg.style.width = (100 * ms / total) + "%";
      seg.title = `${label}: ${fmt(ms, 1)} ms`;
      bar.append(seg);
      const li = document.createElement("li");
      li.innerHTML = `<span class="sw p${i}"></span>`;
      li.append(`${label} ${fmt(ms, 1)} ms (${Math.round(100 * ms / total)}%)`);
      leg.append(li);
      words.push(`${label} ${fmt(ms, 1)} ms`);
    });
    bar.setAttribute("aria-label", "TTFT parts: " + words.join(", "));
  }

  function renderLegend(sources, counts, recomputed) {
    const leg = $("legend");
    leg.textContent = "";
    for (const s of sources) {
      const li = document.createElement("li");
      li.innerHTML = `<span class="sw t s-${s}"></span>`;
      li.append(`${SOURCE_TEXT[s] || s} (${counts[s] || 0})`);
      leg.append(li);
    }
    const li = document.createElement("li");
    li.innerHTML = `<span class="sw rc"></span>`;
    li.append(`hatched + underlined: reused KV recomputed by the selection (${recomputed})`);
    leg.append(li);
  }

  function renderPrompt(ex) {
    const box = $("prompt");
    box.textContent = "";
    let block = null, holder = box;
    tokens.forEach((t, i) => {
      if (t.block !== block) {
        block = t.block;
        holder = document.createElement("span");
        holder.className = "blk";
        const lab = document.createElement("span");
        lab.className = "blk-label";
        lab.setAttribute("aria-hidden", "true");
        lab.textContent = block === 0 ? "shared part / user side\n"
          : `candidate ${block}: ${ex.candidates[block - 1] || ""}\n`;
        holder.append(lab);
        box.append(holder);
      }
      const s = document.createElement("span");
      s.className = `t s-${t.source}` + (t.recomputed ? " rc" : "");
      s.id = "tok-" + i;
      s.setAttribute("role", "option");
      s.dataset.i = String(i);
      s.textContent = t.text;
      s.title = describe(t, i);
      holder.append(s);
    });
    cur = -1;
    box.removeAttribute("aria-activedescendant");
    $("token-info").textContent = "No token selected.";
  }

  function describe(t, i) {
    const layers = t.layers ? `layers ${t.layers[0]}–${t.layers[1]} computed` : "no layer computed";
    return `token ${i} ${JSON.stringify(t.text)} · ${t.kind} · ` +
      (t.block === 0 ? "shared part" : `candidate block ${t.block}`) +
      ` · KV from ${SOURCE_TEXT[t.source] || t.source}` +
      (t.recomputed ? " · RECOMPUTED by the selection" : "") +
      ` · ${layers} · deviation ${fmt(t.deviation, 4)} · attention ${fmt(t.attention, 4)}`;
  }
  function select(i) {
    if (!tokens.length) return;
    i = Math.max(0, Math.min(tokens.length - 1, i));
    if (cur >= 0) $("tok-" + cur).classList.remove("cur");
    cur = i;
    const el = $("tok-" + i);
    el.classList.add("cur");
    el.scrollIntoView({ block: "nearest" });
    $("prompt").setAttribute("aria-activedescendant", el.id);
    $("token-info").textContent = describe(tokens[i], i);
  }
  function onKey(ev) {
    const step = { ArrowRight: 1, ArrowDown: 16, ArrowLeft: -1, ArrowUp: -16 }[ev.key];
    if (step !== undefined) select(cur < 0 ? 0 : cur + step);
    else if (ev.key === "Home") select(0);
    else if (ev.key === "End") select(tokens.length - 1);
    else return;
    ev.preventDefault();
  }

  function renderRanking(ex, target) {
    const body = $("ranking").querySelector("tbody");
    body.textContent = "";
    for (const r of ex.rows) {
      const tr = document.createElement("tr");
      if (r.item_id === target) tr.className = "target";
      const title = ex.titles[r.item_id] || "";
      let change = "–", cls = "";
      if (r.rank_change !== null) {
        change = r.rank_change > 0 ? `▲ ${r.rank_change}` : r.rank_change < 0 ? `▼ ${-r.rank_change}` : "= 0";
        cls = r.rank_change > 0 ? "up" : r.rank_change < 0 ? "down" : "";
      }
      const cells = [String(r.rank), null, fmt(r.score), r.full_rank ?? "–", fmt(r.full_score), change];
      cells.forEach((c, j) => {
        const td = document.createElement("td");
        if (j === 1) {
          td.className = "item";
          td.append(r.item_id + (r.item_id === target ? " (held-out target)" : ""));
          const sm = document.createElement("small");
          sm.textContent = title;
          td.append(sm);
        } else td.textContent = c;
        if (j === 5 && cls) td.className = cls;
        if (j === 5 && r.rank_change) td.setAttribute("aria-label",
          r.rank_change > 0 ? `${r.rank_change} places higher than full` : `${-r.rank_change} places lower than full`);
        tr.append(td);
      });
      body.append(tr);
    }
    $("agreement").textContent = ex.full
      ? `KL(full ‖ method) over the candidates' score softmax: ${fmt(ex.kl, 4)} nats · top-1 ` +
        (ex.top1_agree ? "agrees with full" : `differs (full: ${ex.full.ranking[0]})`) +
        " · change = full's rank − this rank (▲ ranked higher than full)"
      : "Full recompute not asked for (tick 'compare with full').";
  }

  $("token").value = sessionStorage.getItem("rcllm-token") || "";
  $("form").addEventListener("submit", submit);
  $("load-users").addEventListener("click", loadUsers);
  $("user").addEventListener("change", pick);
  $("prompt").addEventListener("keydown", onKey);
  $("prompt").addEventListener("focus", () => { if (cur < 0 && tokens.length) select(0); });
  $("prompt").addEventListener("mouseover", (ev) => {
    const i = ev.target.dataset && ev.target.dataset.i;
    if (i !== undefined) select(+i);
  });
  loadUsers();
})();
