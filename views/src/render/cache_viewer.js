// kvgpt's cache viewer: everything it shows comes from the JSON in #kvgpt-data, written by
// `kvgpt inspect cache --html` (the same numbers as its --json). One step at a time: the cache
// with and without itself, the work of both, the scores and the K/V values. The state (step,
// layer, head) is kept in the address's #fragment, so a view can be linked to.
"use strict";
(function () {
  const P = JSON.parse(document.getElementById("kvgpt-data").textContent);
  const V = P.view;
  const last = V.steps.length - 1;
  const state = { step: last, layer: V.layer, head: V.head };
  const ROW_H = 16, TOP = 22, TOK_W = 130, CELL_W = 22, W_W = 60;
  // The scores and values panels draw the latest of a long run (--json has everything).
  const SCORE_QUERIES = 24, SCORE_KEYS = 48, VALUE_ROWS = 64;
  // The largest magnitude (a loop: spreading a prefill's T² scores into Math.max overflows the stack).
  function maxAbs(rows) {
    let m = 0;
    for (const r of rows) for (const x of r) if (x !== null && Math.abs(x) > m) m = Math.abs(x);
    return m;
  }

  const rgbOf = (w) => kvgptRgb(P.palette, w); // white 0 → dark blue 1, as every picture
  const shade = (w) => "rgb(" + rgbOf(w).join(",") + ")";
  // Values and scores: red below 0, blue above, white at 0, full at the largest magnitude.
  function diverging(x, max) {
    const a = Math.min(Math.abs(x) / (max || 1), 1), c = Math.round(255 * (1 - a));
    return x >= 0 ? "rgb(" + c + "," + c + ",255)" : "rgb(255," + c + "," + c + ")";
  }
  // Text on a cell: white or black, whichever contrasts more with the cell's colour (by WCAG's
  // relative luminance: white below 0.179, where both contrast alike).
  function ink(x, max) {
    const lin = (v) => { const s = v / 255; return s <= 0.04045 ? s / 12.92 : Math.pow((s + 0.055) / 1.055, 2.4); };
    const [r, g, b] = diverging(x, max).match(/\d+/g).map(Number);
    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b) < 0.179 ? "#fff" : "#000";
  }
  // The diverging scale's legend, after a caption: five swatches from −max to +max.
  function legend(id, max) {
    const cap = document.getElementById(id);
    const box = document.createElement("span");
    box.className = "legend";
    box.append(" — colour: ");
    [-1, -0.5, 0, 0.5, 1].forEach((f) => {
      const s = document.createElement("span");
      s.className = "swatch";
      s.style.background = diverging(f * max, max);
      s.style.color = ink(f * max, max);
      s.textContent = (f * max).toFixed(2);
      box.append(s, " ");
    });
    cap.append(box);
  }
  const el = kvgptEl;
  const label = (t) => t.replace(/ /g, "·");
  const tok = (i) => i + " " + label(V.tokens[i]);
  const say = (t) => { document.getElementById("readout").textContent = t; };
  const fmt = (n) => n >= 1e9 ? (n / 1e9).toFixed(2) + " G" : n >= 1e6 ? (n / 1e6).toFixed(2) + " M" :
    n >= 1e3 ? (n / 1e3).toFixed(1) + " k" : String(n);
  const bytes = (n) => n >= 1048576 ? (n / 1048576).toFixed(2) + " MiB" : n >= 1024 ? (n / 1024).toFixed(1) + " KiB" : n + " B";

  function summary(st) {
    const [a, b] = st.written;
    if (st.kind === "prefill") return "Step 0 — prefill: positions 0–" + (b - 1) + " computed together, their K,V written.";
    const what = st.kind === "prompt" ? "a prompt token fed alone" : "decode";
    return "Step " + st.step + " — " + what + ": “" + label(V.tokens[a]) + "” at position " + a + " reads K,V of positions 0–" +
      (a - 1) + " from the cache and writes position " + a + ". Without the cache: positions 0–" + a +
      " run again (" + (st.recomputed_same_bits ? "same bits" : "NOT the same bits") + ").";
  }

  function drawWork(st) {
    const t = document.getElementById("work"), w = st.work;
    t.replaceChildren();
    const rows = [["", "with cache", "without cache", "ratio"],
      ["positions run", w.with_cache.positions, w.without_cache.positions, ""],
      ["multiply-adds", fmt(w.with_cache.macs), fmt(w.without_cache.macs), w.ratio.macs.toFixed(1) + "×"],
      ["weight bytes", bytes(w.with_cache.weight_bytes), bytes(w.without_cache.weight_bytes), w.ratio.weight_bytes.toFixed(1) + "×"],
      ["K/V bytes read", bytes(w.with_cache.kv_read_bytes), bytes(w.without_cache.kv_read_bytes), w.ratio.kv_read_bytes.toFixed(1) + "×"]];
    rows.forEach((r, i) => {
      const tr = document.createElement("tr");
      r.forEach((c) => { const e = document.createElement(i ? "td" : "th"); e.textContent = c; tr.appendChild(e); });
      t.appendChild(tr);
    });
    const svg = document.getElementById("ratios");
    svg.replaceChildren();
    const max = Math.max(...V.steps.map((s) => s.work.ratio.macs)), bw = Math.max(3, Math.min(14, 420 / V.steps.length));
    svg.setAttribute("width", V.steps.length * bw + 40);
    svg.setAttribute("height", 90);
    V.steps.forEach((s, i) => {
      const h = 70 * s.work.ratio.macs / max;
      const r = el("rect", { class: "bar" + (i === state.step ? " current" : ""), x: 30 + i * bw, y: 80 - h,
        width: bw - 1, height: h, fill: "#4292c6", "data-step": i, "data-ratio": s.work.ratio.macs }, svg);
      r.addEventListener("mouseenter", () => say("step " + i + ": " + s.work.ratio.macs.toFixed(2) + "× the multiply-adds without the cache"));
      r.addEventListener("click", () => go(i));
    });
    el("text", { x: 0, y: 12 }, svg, max.toFixed(1) + "×");
    el("text", { x: 0, y: 80 }, svg, "0");
  }

  // One side: rows are positions 0..n-1, cells K and V (highlighted when this step computed the
  // row), then the query's weight on that key.
  function drawSide(id, st, cached) {
    const svg = document.getElementById(id), [a, b] = st.written;
    svg.replaceChildren();
    svg.setAttribute("width", TOK_W + 2 * CELL_W + W_W + 10);
    svg.setAttribute("height", TOP + b * ROW_H + 6);
    el("text", { x: TOK_W, y: 14 }, svg, "K");
    el("text", { x: TOK_W + CELL_W, y: 14 }, svg, "V");
    el("text", { x: TOK_W + 2 * CELL_W + 4, y: 14 }, svg, cached ? "weight" : "");
    const weights = st.weights[state.layer][state.head];
    for (let pos = 0; pos < b; pos++) {
      const y = TOP + pos * ROW_H, computed = !cached || pos >= a;
      el("text", { class: "pos-label", x: 2, y: y + 12 }, svg, tok(pos).slice(0, 17));
      ["K", "V"].forEach((part, j) => {
        const r = el("rect", { class: "kv " + (computed ? "written" : "read"), x: TOK_W + j * CELL_W, y,
          width: CELL_W, height: ROW_H, fill: computed ? P.written : P.read, "data-pos": pos, "data-part": part }, svg);
        r.addEventListener("mouseenter", () => say(part + " of " + tok(pos) + (computed
          ? (cached ? ": written by this step" : ": computed again") : ": read from the cache (written at step " + writtenAt(pos) + ")")));
      });
      if (cached) {
        const w = weights[pos];
        const r = el("rect", { class: "w", x: TOK_W + 2 * CELL_W + 4, y, width: W_W, height: ROW_H, fill: shade(w),
          "data-pos": pos, "data-w": w }, svg);
        r.addEventListener("mouseenter", () => say("query " + tok(b - 1) + " → key " + tok(pos) + ": weight " + w.toFixed(4)));
      }
    }
  }
  function writtenAt(pos) { return V.steps.findIndex((s) => pos < s.written[1]); }

  function drawScores(st) {
    const svg = document.getElementById("scores"), [a, b] = st.written, n = b;
    document.getElementById("scores-caption").textContent = "Scores before the softmax, layer " + V.layer +
      " head " + V.head + " (q·k/√" + V.head_dim + "; −∞ is the causal mask)";
    svg.replaceChildren();
    const cw = 44, q0 = Math.max(0, st.scores.length - SCORE_QUERIES), k0 = Math.max(0, n - SCORE_KEYS);
    const shown = st.scores.slice(q0);
    if (q0 > 0 || k0 > 0) {
      document.getElementById("scores-caption").textContent += "; the latest " + shown.length + " queries × " +
        (n - k0) + " keys (--json has them all)";
    }
    svg.setAttribute("width", 50 + (n - k0) * cw);
    svg.setAttribute("height", TOP + shown.length * ROW_H + 6);
    const max = maxAbs(shown);
    legend("scores-caption", max);
    for (let k = k0; k < n; k++) el("text", { x: 50 + (k - k0) * cw + 4, y: 14 }, svg, String(k));
    shown.forEach((row, i) => {
      const y = TOP + i * ROW_H, qi = q0 + i;
      el("text", { x: 2, y: y + 12 }, svg, "q" + (a + qi));
      row.slice(k0).forEach((x, j) => {
        const k = k0 + j;
        const r = el("rect", { class: "score" + (x === null ? " masked" : ""), x: 50 + j * cw, y, width: cw, height: ROW_H,
          fill: x === null ? "#d9d9d9" : diverging(x, max), "data-q": a + qi, "data-k": k, "data-s": x === null ? "-inf" : x }, svg);
        el("text", { x: 50 + j * cw + 2, y: y + 12, "pointer-events": "none", fill: x === null ? "#000" : ink(x, max) }, svg,
          x === null ? "−∞" : x.toFixed(2));
        r.addEventListener("mouseenter", () => say("score of query " + (a + qi) + " on key " + k + ": " + (x === null ? "−∞ (masked)" : x)));
      });
    });
  }

  function drawValues(st) {
    const svg = document.getElementById("values"), [a, b] = st.written, hs = V.head_dim, cw = 7;
    document.getElementById("values-caption").textContent = "K (left) and V (right) of layer " + V.layer +
      " head " + V.head + ", one row per position; this step's rows outlined";
    svg.replaceChildren();
    const p0 = Math.max(0, b - VALUE_ROWS);
    if (p0 > 0) document.getElementById("values-caption").textContent += " (the latest " + (b - p0) + " positions)";
    svg.setAttribute("width", 40 + 2 * hs * cw + 20);
    svg.setAttribute("height", TOP + (b - p0) * ROW_H + 6);
    const max = Math.max(maxAbs(V.k.slice(p0, b)), maxAbs(V.v.slice(p0, b)));
    legend("values-caption", max);
    for (let pos = p0; pos < b; pos++) {
      const y = TOP + (pos - p0) * ROW_H;
      el("text", { x: 2, y: y + 12 }, svg, String(pos));
      [["K", V.k], ["V", V.v]].forEach(([part, m], j) => {
        const x0 = 40 + j * (hs * cw + 20);
        m[pos].forEach((x, d) => {
          const r = el("rect", { class: "val", x: x0 + d * cw, y, width: cw, height: ROW_H, fill: diverging(x, max),
            "data-pos": pos, "data-part": part, "data-d": d, "data-v": x }, svg);
          r.addEventListener("mouseenter", () => say(part + "[" + pos + "][" + d + "] = " + x));
        });
        if (pos >= a) el("rect", { class: "outline", x: x0, y, width: hs * cw, height: ROW_H, fill: "none", stroke: P.written, "stroke-width": 2 }, svg);
      });
    }
  }

  function draw() {
    const st = V.steps[state.step];
    document.getElementById("step").value = state.step;
    document.getElementById("layer").value = state.layer;
    document.getElementById("head").value = state.head;
    document.getElementById("summary").textContent = summary(st);
    drawWork(st);
    drawSide("cached", st, true);
    drawSide("uncached", st, false);
    drawScores(st);
    drawValues(st);
    history.replaceState(null, "", "#step=" + state.step + "&layer=" + state.layer + "&head=" + state.head);
    say("Hover a cell.");
  }
  function go(s) { state.step = Math.max(0, Math.min(last, s)); draw(); }

  const fill = (id, n) => { const s = document.getElementById(id); for (let i = 0; i < n; i++) { const o = document.createElement("option"); o.value = i; o.textContent = i; s.appendChild(o); } };
  fill("layer", V.n_layer);
  fill("head", V.n_head);
  const slider = document.getElementById("step");
  slider.max = last;
  slider.addEventListener("input", () => go(+slider.value));
  document.getElementById("prev").addEventListener("click", () => go(state.step - 1));
  document.getElementById("next").addEventListener("click", () => go(state.step + 1));
  document.getElementById("layer").addEventListener("change", (e) => { state.layer = +e.target.value; draw(); });
  document.getElementById("head").addEventListener("change", (e) => { state.head = +e.target.value; draw(); });
  // A linked view: only this page's own keys, and only whole numbers (clamped below).
  for (const kv of location.hash.slice(1).split("&")) {
    const [k, v] = kv.split("=");
    if (Object.hasOwn(state, k) && v !== "" && Number.isInteger(+v)) state[k] = +v;
  }
  state.step = Math.max(0, Math.min(last, state.step));
  state.layer = Math.max(0, Math.min(V.n_layer - 1, state.layer));
  state.head = Math.max(0, Math.min(V.n_head - 1, state.head));
  draw();
  document.body.dataset.ready = "1";
})();
