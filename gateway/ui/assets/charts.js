// Charts in plain SVG: built as DOM nodes (no inline style: the CSP allows none), coloured by
// the stylesheet's classes, each with a <title> per mark and an accessible name.

const NS = "http://www.w3.org/2000/svg";

/** An SVG element: s("rect", {x: 1, class: "bar"}, child, …). */
export function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** A nice axis maximum ≥ `max` (1, 2, 5 × 10^n). */
export function niceMax(max) {
  if (max <= 0) return 1;
  const p = 10 ** Math.floor(Math.log10(max));
  for (const m of [1, 2, 5, 10]) if (m * p >= max) return m * p;
  return 10 * p;
}

/**
 * Stacked bars: `bars` = [{label, title, values: {series: n}}], `series` = [{key, label, cls}].
 * Returns an <svg role="img"> with `name` as its accessible name.
 */
export function stackedBars({ bars, series, name, id, width = 900, height = 220, tickEvery = 10 }) {
  const left = 36, bottom = 22, top = 8;
  const plotW = width - left - 4, plotH = height - bottom - top;
  const totals = bars.map((b) => series.reduce((n, se) => n + (b.values[se.key] || 0), 0));
  const max = niceMax(Math.max(0, ...totals));
  const bw = plotW / Math.max(1, bars.length);
  const y = (v) => top + plotH - (v / max) * plotH;
  // Gridlines at whole counts only: a middle line at 2.5 labelled "3" misreads every bar.
  const grid = (max >= 2 && max % 2 === 0 ? [0, max / 2, max] : [0, max]).map((v) =>
    s("g", {}, s("line", { x1: left, x2: width - 4, y1: y(v), y2: y(v), class: "grid-line" }),
      s("text", { x: left - 6, y: y(v) + 4, class: "axis", "text-anchor": "end" }, String(v))));
  const marks = bars.map((b, i) => {
    let acc = 0;
    const x = left + i * bw + 1;
    const rects = series.map((se) => {
      const v = b.values[se.key] || 0;
      if (!v) return null;
      const r = s("rect", { x, y: y(acc + v), width: Math.max(1, bw - 2), height: Math.max(1, y(acc) - y(acc + v)), class: se.cls });
      acc += v;
      return r;
    });
    const hit = s("rect", { x: left + i * bw, y: top, width: bw, height: plotH, class: "hit" }, s("title", {}, b.title));
    const tick = i % tickEvery === 0 ? s("text", { x: x + bw / 2, y: height - 6, class: "axis", "text-anchor": "middle" }, b.label) : null;
    return s("g", {}, rects, tick, hit);
  });
  return s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": name, id, class: "chart" }, s("title", {}, name), grid, marks);
}

/** Horizontal bars: rows = [{label, parts: [{value, cls, title}]}]. */
export function hbars({ rows, name, id, width = 600 }) {
  const rowH = 26, left = 140, height = Math.max(1, rows.length) * rowH + 6;
  const max = niceMax(Math.max(0, ...rows.map((r) => r.parts.reduce((n, p) => n + p.value, 0))));
  const plotW = width - left - 50;
  const g = rows.map((r, i) => {
    let acc = 0;
    const yy = 4 + i * rowH;
    const parts = r.parts.map((p) => {
      if (!p.value) return null;
      const x = left + (acc / max) * plotW;
      acc += p.value;
      return s("rect", { x, y: yy, width: Math.max(1, (p.value / max) * plotW), height: rowH - 8, class: p.cls }, s("title", {}, p.title));
    });
    return s("g", {},
      s("text", { x: left - 8, y: yy + rowH / 2, class: "label", "text-anchor": "end" }, r.label),
      parts,
      s("text", { x: left + (acc / max) * plotW + 6, y: yy + rowH / 2, class: "axis" }, String(acc)));
  });
  // Drawn at its own width at most (class chart-h): stretched, its labels outgrow the page's text.
  return s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": name, id, class: "chart chart-h" }, s("title", {}, name), g);
}
