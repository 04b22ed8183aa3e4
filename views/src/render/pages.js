// What kvgpt's HTML pages share (included before each page's own script): the colour scale of
// every picture, interpolated between the stops the page carries, and making SVG elements.
"use strict";
const KVGPT_SVGNS = "http://www.w3.org/2000/svg";
// The RGB of weight w (clamped to 0..1) between `palette`'s stops, as the terminal and SVG do.
function kvgptRgb(palette, w) {
  const p = palette, x = (w >= 0 ? Math.min(w, 1) : 0) * (p.length - 1);
  const i = Math.min(Math.floor(x), p.length - 2), f = x - i;
  return [0, 1, 2].map((j) => Math.round(p[i][j] + (p[i + 1][j] - p[i][j]) * f));
}
function kvgptEl(name, attrs, parent, text) {
  const e = document.createElementNS(KVGPT_SVGNS, name);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
