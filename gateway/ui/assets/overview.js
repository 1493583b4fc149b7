// Overview: the last hour of runs (GET /stats/overview, one request), refreshed by live events.
import { api, LiveFeed } from "./api.js";
import { hbars, stackedBars } from "./charts.js";
import { duration, h, inZone } from "./format.js";
import { liveState } from "./shell.js";

const SERIES = [
  { key: "succeeded", label: "Succeeded", cls: "bar-succeeded" },
  { key: "failed", label: "Failed", cls: "bar-failed" },
  { key: "cancelled", label: "Cancelled", cls: "bar-cancelled" },
  { key: "skipped", label: "Skipped", cls: "bar-skipped" },
];
const REFRESH_MS = 2000; // at most one reload per this long, however many events arrive

function ms(v) {
  return v === null || v === undefined ? "—" : duration(v / 1000);
}

function tile(id, label, value, note) {
  return h("div", { class: "tile", id }, h("div", { class: "tile-label" }, label), h("div", { class: "tile-value" }, value), note ? h("div", { class: "muted" }, note) : null);
}

function time(iso) {
  return inZone(iso).slice(11, 16);
}

/** The chart's numbers as a table (the minutes with runs), for keyboard and screen readers. */
function minutesTable(data) {
  const busy = data.minutes.filter((m) => SERIES.some((se) => m[se.key]));
  return h(
    "details",
    { id: "per-minute-table" },
    h("summary", {}, `The ${busy.length} minute${busy.length === 1 ? "" : "s"} with finished runs, as a table`),
    h(
      "table",
      { class: "grid" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Minute (UTC)"), SERIES.map((se) => h("th", { scope: "col", class: "num" }, se.label)))),
      h("tbody", {}, busy.map((m) => h("tr", {}, h("td", { class: "t" }, time(m.at)), SERIES.map((se) => h("td", { class: "num" }, String(m[se.key])))))),
    ),
  );
}

function view(data) {
  const t = data.totals;
  const finished = t.SUCCEEDED + t.FAILED + t.CANCELLED + t.SKIPPED;
  const rate = data.failureRate === null ? "—" : `${(data.failureRate * 100).toFixed(1)} %`;
  const d = data.delay;
  const tiles = h(
    "div",
    { class: "tiles" },
    tile("tile-finished", "Runs finished", finished.toLocaleString("en"), `${t.SUCCEEDED} succeeded · ${t.FAILED} failed · ${t.CANCELLED} cancelled · ${t.SKIPPED} skipped`),
    tile("tile-failure-rate", "Failure rate", rate, "failed / (succeeded + failed)"),
    tile("tile-delay", "Schedule → start p50", ms(d.p50Ms), `p95 ${ms(d.p95Ms)} · p99 ${ms(d.p99Ms)} · max ${ms(d.maxMs)} · ${d.runs.toLocaleString("en")} run${d.runs === 1 ? "" : "s"}`),
  );
  const bars = data.minutes.map((m) => ({
    label: time(m.at),
    title: `${time(m.at)} UTC: ${SERIES.map((se) => `${m[se.key]} ${se.label.toLowerCase()}`).join(", ")}`,
    values: m,
  }));
  const legend = h("ul", { class: "legend" }, SERIES.map((se) => h("li", {}, h("span", { class: `swatch ${se.cls}` }), se.label)));
  const queues = data.queues.length
    ? hbars({
        id: "queues-chart",
        name: "Unfinished runs per queue",
        rows: data.queues.map((q) => ({
          label: q.queue,
          parts: [
            { value: q.queued, cls: "bar-queued", title: `${q.queue}: ${q.queued} queued` },
            { value: q.running, cls: "bar-running", title: `${q.queue}: ${q.running} running` },
            { value: q.retrying, cls: "bar-retrying", title: `${q.queue}: ${q.retrying} retrying` },
          ],
        })),
      })
    : h("p", { class: "muted" }, "No run is waiting or running.");
  const queueTable = h(
    "table",
    { class: "grid", id: "queues" },
    h("caption", { class: "visually-hidden" }, "Unfinished runs per queue"),
    h("thead", {}, h("tr", {}, ["Queue", "Queued", "Running", "Retrying"].map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, data.queues.map((q) => h("tr", { dataset: { queue: q.queue } }, h("td", {}, q.queue), h("td", { class: "num queued" }, String(q.queued)), h("td", { class: "num" }, String(q.running)), h("td", { class: "num" }, String(q.retrying))))),
  );
  return [
    h("p", { class: "muted" }, `${inZone(data.windowStart)} → ${inZone(data.windowEnd)}`),
    tiles,
    h("h2", { id: "per-minute-title" }, "Runs per minute, by final status"),
    stackedBars({ id: "per-minute", name: `Runs per minute by final status, last hour: ${finished} finished`, bars, series: SERIES }),
    legend,
    minutesTable(data),
    h("h2", {}, "Queue depth"),
    h("p", { class: "muted" }, "Runs the store records as queued, running or retrying now."),
    queues,
    data.queues.length ? queueTable : null,
  ].filter(Boolean);
}

export function renderOverview(main, params) {
  const body = h("div", { id: "overview" });
  const status = h("p", { class: "muted", role: "status", id: "overview-status" }, "Loading…");
  main.append(h("h1", {}, "Overview"), status, body);
  const q = new URLSearchParams();
  if (params.get("allUsers") === "true") q.set("allUsers", "true");
  let stopped = false;
  let timer = null;

  async function load() {
    timer = null;
    try {
      const data = await api(`/stats/overview${q.toString() ? `?${q}` : ""}`);
      if (stopped) return;
      body.replaceChildren(...view(data));
      status.textContent = params.get("allUsers") === "true" ? "Every user's runs." : "Your runs.";
      status.classList.remove("error");
    } catch (e) {
      status.textContent = `Cannot load the overview: ${e.message}`;
      status.classList.add("error");
    }
  }
  const soon = () => {
    if (!timer && !stopped) timer = setTimeout(load, REFRESH_MS);
  };
  const feed = new LiveFeed({ onEvent: soon, onState: liveState, onResync: soon }).start();
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
    feed.stop();
  };
}
