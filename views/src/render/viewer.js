// kvgpt's attention viewer: everything it shows comes from the JSON in #kvgpt-data, written by
// `kvgpt inspect attention --html`. For one layer: lines from each query token (left) to the keys
// it attends to (right), as bertviz draws them, and the heatmap with both axes labelled; above
// them, every layer × head as a thumbnail. The state (layer, head or "all", the query of the
// all-heads heatmap) is kept in the address's #fragment, so a view can be linked to.
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("kvgpt-data").textContent);
  const S = D.tokens.length;
  const HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"];
  const state = { layer: D.layers[0], head: D.heads[0], query: S - 1 };
  if (D.query !== null) { state.query = D.query; state.head = "all"; }
  const hiddenHeads = new Set(); // heads switched off in the all-heads lines
  let hover = null; // {side: "q"|"k", pos} while the pointer is on a token or a cell

  // The scale of kvgpt's terminal and SVG output: the same stops, interpolated the same way.
  const rgbOf = (w) => kvgptRgb(D.palette, w);
  function shade(w) { return "rgb(" + rgbOf(w).join(",") + ")"; }
  function darkOn(w) { const c = rgbOf(w); return 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 140; }
  const el = kvgptEl;
  function headColour(h) { return HEAD_COLOURS[h % HEAD_COLOURS.length]; }
  // attn[layer index][head index][query] holds the weights on keys 0..query.
  function row(layer, head, q) { return D.attn[D.layers.indexOf(layer)][D.heads.indexOf(head)][q]; }
  function shownHeads() { return state.head === "all" ? D.heads.filter((h) => !hiddenHeads.has(h)) : [state.head]; }
  // A token as drawn: cut to 24 characters (the whole of it is in its tooltip).
  const MAX_CHARS = 24;
  function cut(t) { return t.length > MAX_CHARS ? t.slice(0, MAX_CHARS - 1) + "…" : t; }
  function tokenText(i) { return i + " " + D.tokens[i]; }
  const longest = D.tokens.reduce((m, t, i) => Math.max(m, cut(t).length + String(i).length + 1), 1);
  function say(text) { document.getElementById("readout").textContent = text; }
  const IDLE = "Hover a token or a cell.";

  // --- lines: queries on the left, keys on the right ---------------------------------------
  // The tokens are built once per view; hovering redraws only the lines and the highlights, so
  // the element under the pointer stays (and a click on it lands).
  const ROW_H = 18, TOP = 24;
  const BOX_W = Math.max(60, Math.ceil(7.3 * Math.max(...D.tokens.map((t) => cut(t).length))) + 12);
  const LEFT_X = BOX_W + 8, RIGHT_X = LEFT_X + 180;
  const lineY = (i) => TOP + i * ROW_H + ROW_H / 2;
  function drawLines() {
    const svg = document.getElementById("lines");
    svg.replaceChildren();
    svg.setAttribute("width", RIGHT_X + BOX_W + 130);
    svg.setAttribute("height", TOP + S * ROW_H + 10);
    el("text", { x: LEFT_X, y: 12, "text-anchor": "end", "font-size": 11, fill: "#555" }, svg, "query");
    el("text", { x: RIGHT_X, y: 12, "font-size": 11, fill: "#555" }, svg, "key");
    el("g", { id: "attn-lines" }, svg);
    for (const side of ["q", "k"]) {
      for (let i = 0; i < S; i++) {
        const g = el("g", { class: "tok " + side, "data-pos": i }, svg);
        el("title", {}, g, tokenText(i));
        el("rect", { class: "bg", x: side === "q" ? LEFT_X - BOX_W : RIGHT_X, y: TOP + i * ROW_H + 1, width: BOX_W,
          height: ROW_H - 2, rx: 2 }, g);
        el("text", { x: side === "q" ? LEFT_X - 4 : RIGHT_X + 4, y: lineY(i) + 4, "font-size": 12,
          "text-anchor": side === "q" ? "end" : "start", "data-pos": i }, g, cut(D.tokens[i]));
        g.addEventListener("mouseenter", () => { hover = { side: side, pos: i }; describeToken(side, i); paintLines(); });
        g.addEventListener("mouseleave", () => { hover = null; say(IDLE); paintLines(); });
        if (side === "q") g.addEventListener("click", () => { state.query = i; update(); });
      }
    }
    if (D.prompt_len < S) {
      const yd = TOP + D.prompt_len * ROW_H;
      el("line", { class: "divider", x1: 0, y1: yd, x2: RIGHT_X + BOX_W + 4, y2: yd }, svg);
      el("text", { class: "divider-label", x: RIGHT_X + BOX_W + 8, y: yd + 4 }, svg, "↓ decoded with");
      el("text", { class: "divider-label", x: RIGHT_X + BOX_W + 8, y: yd + 16 }, svg, "the KV cache on");
    }
    paintLines();
  }
  // The lines of the hovered token (of the chosen query in all-heads mode; every line when
  // nothing is chosen), and the keys a hovered query reads shaded by their weight (one head).
  function paintLines() {
    const lines = document.getElementById("attn-lines");
    lines.replaceChildren();
    const only = hover && hover.side === "q" ? hover.pos : state.head === "all" && !hover ? state.query : null;
    for (const h of shownHeads()) {
      for (let q = 0; q < S; q++) {
        if (only !== null && only !== q) continue;
        const r = row(state.layer, h, q);
        for (let k = 0; k <= q; k++) {
          if (hover && hover.side === "k" && hover.pos !== k) continue;
          el("line", {
            class: "attn", x1: LEFT_X + 6, y1: lineY(q), x2: RIGHT_X - 6, y2: lineY(k),
            stroke: headColour(h), "stroke-width": 2, "stroke-opacity": r[k],
            "data-head": h, "data-q": q, "data-k": k, "data-w": r[k],
          }, lines);
        }
      }
    }
    const reading = hover && hover.side === "q" && state.head !== "all" ? row(state.layer, state.head, hover.pos) : null;
    for (const g of document.querySelectorAll("#lines .tok")) {
      const side = g.classList.contains("q") ? "q" : "k", i = Number(g.dataset.pos);
      const bg = g.querySelector("rect.bg"), text = g.querySelector("text");
      g.classList.toggle("active", (hover !== null && hover.side === side && hover.pos === i) ||
        (side === "q" && state.head === "all" && i === state.query));
      if (side === "k" && reading && i < reading.length) {
        bg.setAttribute("style", "fill:" + shade(reading[i]));
        bg.setAttribute("data-w", reading[i]);
        text.setAttribute("fill", darkOn(reading[i]) ? "#fff" : "#222");
      } else {
        bg.removeAttribute("style");
        bg.removeAttribute("data-w");
        text.setAttribute("fill", "#222");
      }
    }
  }
  function describeToken(side, i) {
    if (state.head === "all") {
      say(side === "q" ? "query " + tokenText(i) + " (click to show it over every head)" : "key " + tokenText(i));
      return;
    }
    if (side === "q") {
      const r = row(state.layer, state.head, i);
      let best = 0;
      for (let k = 1; k <= i; k++) if (r[k] > r[best]) best = k;
      say("layer " + state.layer + " head " + state.head + ": " + tokenText(i) + " attends most to " +
        tokenText(best) + " (" + r[best].toFixed(4) + ")");
    } else {
      let total = 0;
      for (let q = i; q < S; q++) total += row(state.layer, state.head, q)[i];
      say("layer " + state.layer + " head " + state.head + ": " + tokenText(i) + " gets " +
        total.toFixed(4) + " of the weight of " + (S - i) + " queries");
    }
  }

  // --- the heads' switches (all-heads mode), as bertviz's coloured squares -----------------
  function drawHeadSwitches() {
    const box = document.getElementById("head-switches");
    box.replaceChildren();
    box.hidden = state.head !== "all";
    if (box.hidden) return;
    for (const h of D.heads) {
      const b = document.createElement("button");
      b.type = "button";
      b.className = "head-switch" + (hiddenHeads.has(h) ? " off" : "");
      b.dataset.head = h;
      b.style.setProperty("--c", headColour(h));
      b.textContent = "head " + h;
      b.title = "show or hide head " + h + "'s lines";
      b.addEventListener("click", () => {
        if (hiddenHeads.has(h)) hiddenHeads.delete(h); else hiddenHeads.add(h);
        drawHeadSwitches();
        paintLines();
      });
      box.appendChild(b);
    }
  }

  // --- heatmap: one head's queries × keys, or one query's heads × keys -----------------------
  function drawGrid() {
    const svg = document.getElementById("grid");
    svg.replaceChildren();
    const all = state.head === "all";
    const rows = all ? D.heads.map((h) => ({ label: "head " + h, head: h, q: state.query }))
      : Array.from({ length: S }, (_, q) => ({ label: q + " " + cut(D.tokens[q]), head: state.head, q: q }));
    const ncols = all ? state.query + 1 : S;
    // Cells big enough for a label each, up to 256 positions (the page scrolls); beyond,
    // smaller cells and every few labels.
    const n = Math.max(ncols, rows.length);
    const cell = n <= 256 ? Math.max(11, Math.min(22, Math.floor(480 / n))) : Math.max(4, Math.floor(1400 / n));
    const every = Math.max(1, Math.ceil(11 / cell));
    const charW = 6.2;
    const lw = Math.ceil(charW * (all ? 8 : longest)) + 14, top = Math.ceil(charW * longest) + 14;
    svg.setAttribute("width", lw + ncols * cell + 200);
    svg.setAttribute("height", top + rows.length * cell + 20);
    document.getElementById("grid-caption").textContent = all
      ? "Layer " + state.layer + ", every head: query " + tokenText(state.query) +
        " (rows are heads, columns keys). Click a query token on the left to choose another."
      : "Layer " + state.layer + " head " + state.head + ": rows are queries, columns keys.";
    el("text", { class: "corner", x: lw - 4, y: top - 4, "font-size": 10, "text-anchor": "end", fill: "#555" }, svg,
      all ? "head" : "q\\k");
    el("rect", { x: lw, y: top, width: ncols * cell, height: rows.length * cell, fill: D.masked }, svg);
    for (let k = 0; k < ncols; k++) {
      if (k % every) continue;
      const x = lw + k * cell + cell * 0.7;
      el("text", { class: "col-label", x: x, y: top - 4, "font-size": 10,
        transform: "rotate(-90 " + x + " " + (top - 4) + ")" }, svg, k + " " + cut(D.tokens[k]));
    }
    rows.forEach((r, i) => {
      if (i % every === 0) {
        el("text", { class: "row-label", x: lw - 4, y: top + i * cell + cell * 0.75, "font-size": 10,
          "text-anchor": "end" }, svg, r.label);
      }
      const ws = row(state.layer, r.head, r.q);
      for (let k = 0; k <= r.q && k < ncols; k++) {
        const c = el("rect", { class: "cell", x: lw + k * cell, y: top + i * cell, width: cell, height: cell,
          fill: shade(ws[k]), "data-head": r.head, "data-q": r.q, "data-k": k, "data-w": ws[k] }, svg);
        c.addEventListener("mouseenter", () => {
          say("layer " + state.layer + " head " + r.head + ": " + tokenText(r.q) + " → " + tokenText(k) +
            ": " + ws[k].toFixed(4));
          if (!all) { hover = { side: "q", pos: r.q }; paintLines(); }
        });
        c.addEventListener("mouseleave", () => { say(IDLE); if (!all) { hover = null; paintLines(); } });
      }
    });
    if (!all && D.prompt_len < S) {
      const yd = top + D.prompt_len * cell;
      el("line", { class: "divider", x1: lw - 60, y1: yd, x2: lw + ncols * cell + 6, y2: yd }, svg);
      el("text", { class: "divider-label", x: lw + ncols * cell + 8, y: yd + 3 }, svg, "decoded with the KV cache on ↓");
    }
  }

  // --- the model view: every layer × head as a thumbnail; a click opens it ------------------
  function drawModel() {
    const box = document.getElementById("model");
    const side = Math.max(48, Math.min(96, S));
    box.replaceChildren();
    box.style.gridTemplateColumns = "auto repeat(" + D.heads.length + ", " + (side + 6) + "px)";
    box.appendChild(document.createElement("span"));
    for (const h of D.heads) {
      const s = document.createElement("span");
      s.className = "model-head";
      s.textContent = "head " + h;
      box.appendChild(s);
    }
    for (const l of D.layers) {
      const s = document.createElement("span");
      s.className = "model-layer";
      s.textContent = "layer " + l;
      box.appendChild(s);
      for (const h of D.heads) {
        const c = document.createElement("canvas");
        c.width = S;
        c.height = S;
        c.className = "thumb";
        c.style.width = c.style.height = side + "px";
        c.dataset.layer = l;
        c.dataset.head = h;
        c.title = "layer " + l + " head " + h;
        const ctx = c.getContext("2d"), img = ctx.createImageData(S, S);
        const grey = [1, 3, 5].map((j) => parseInt(D.masked.slice(j, j + 2), 16));
        for (let q = 0; q < S; q++) {
          const r = row(l, h, q);
          for (let k = 0; k < S; k++) {
            const px = k <= q ? rgbOf(r[k]) : grey, at = 4 * (q * S + k);
            img.data[at] = px[0]; img.data[at + 1] = px[1]; img.data[at + 2] = px[2]; img.data[at + 3] = 255;
          }
        }
        ctx.putImageData(img, 0, 0);
        c.addEventListener("click", () => { state.layer = l; state.head = h; update(); });
        box.appendChild(c);
      }
    }
  }

  // --- the colour scale, with values -------------------------------------------------------
  function drawScale() {
    const svg = document.getElementById("scale");
    svg.replaceChildren();
    svg.setAttribute("width", 420);
    svg.setAttribute("height", 46);
    const g = el("g", { transform: "translate(10,0)" }, svg);
    el("text", { x: 0, y: 11, "font-size": 11 }, g, "attention weight (darker is more; grey: masked)");
    for (let i = 0; i < 100; i++) {
      el("rect", { class: "step", x: 2 * i, y: 16, width: 2.2, height: 12, fill: shade((i + 0.5) / 100) }, g);
    }
    for (const t of [0, 0.25, 0.5, 0.75, 1]) {
      el("line", { x1: 200 * t, y1: 28, x2: 200 * t, y2: 31, stroke: "#333" }, g);
      el("text", { class: "tick", x: 200 * t, y: 41, "font-size": 10, "text-anchor": "middle" }, g, String(t));
    }
  }

  // --- state <-> controls <-> #fragment ------------------------------------------------------
  function readHash() {
    const p = new URLSearchParams(location.hash.slice(1));
    const l = Number(p.get("layer")), h = p.get("head"), q = Number(p.get("query"));
    if (p.has("layer") && D.layers.includes(l)) state.layer = l;
    if (h === "all") state.head = "all";
    else if (h !== null && D.heads.includes(Number(h))) state.head = Number(h);
    if (p.has("query") && Number.isInteger(q) && q >= 0 && q < S) state.query = q;
  }
  function update() {
    document.getElementById("layer").value = String(state.layer);
    document.getElementById("head").value = String(state.head);
    const frag = "#layer=" + state.layer + "&head=" + state.head + "&query=" + state.query;
    if (location.hash !== frag) history.replaceState(null, "", frag);
    for (const c of document.querySelectorAll("#model .thumb")) {
      c.classList.toggle("selected", Number(c.dataset.layer) === state.layer &&
        (state.head === "all" || Number(c.dataset.head) === state.head));
    }
    hover = null;
    say(IDLE);
    drawHeadSwitches();
    drawLines();
    drawGrid();
  }
  const layerSel = document.getElementById("layer"), headSel = document.getElementById("head");
  for (const l of D.layers) layerSel.appendChild(new Option("layer " + l, String(l)));
  for (const h of D.heads) headSel.appendChild(new Option("head " + h, String(h)));
  headSel.appendChild(new Option(D.heads.length > 1 ? "all heads" : "one query", "all"));
  layerSel.addEventListener("change", () => { state.layer = Number(layerSel.value); update(); });
  headSel.addEventListener("change", () => {
    state.head = headSel.value === "all" ? "all" : Number(headSel.value);
    update();
  });
  document.getElementById("grid").addEventListener("mouseleave", () => say(IDLE));
  window.addEventListener("hashchange", () => { readHash(); update(); });
  readHash();
  drawScale();
  drawModel();
  update();
  document.body.setAttribute("data-ready", "1");
})();
