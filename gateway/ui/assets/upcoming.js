// Upcoming: a 7-day heatmap by hour of the user's fire times (GET /stats/upcoming, one request),
// in a zone of the user's choice, with every fire time that DST shifts, doubles or drops marked.
import { api, LiveFeed } from "./api.js";
import { h, inZone, shortId } from "./format.js";
import { liveState, navigate } from "./shell.js";

const LEVELS = 5;
const KIND_WORDS = {
  shifted: "in a spring-forward gap: runs at the gap's end",
  skipped: "in a spring-forward gap: does not run",
  "fold-first": "in the repeated fall-back hour: first pass",
  "fold-second": "in the repeated fall-back hour: second pass",
};

function browserZone() {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  } catch {
    return "UTC";
  }
}

/** [local date, hour] of an instant in `zone`. */
function localCell(iso, zone) {
  const text = inZone(iso, zone); // "2026-03-29 03:00:00 CEST"
  return [text.slice(0, 10), Number(text.slice(11, 13))];
}

/**
 * A cell's shade, 0 (no fire time) to LEVELS: scaled from the fewest fire times of any non-empty
 * hour to the most, so an every-minute job (60 in every hour) does not paint every cell alike
 * and hide the hours where other jobs add up. A count outside [min, max] (an edge hour of the
 * window, left out of the scale) takes the nearest end.
 */
function level(n, min, max) {
  if (!n) return 0;
  if (max === min) return LEVELS;
  return Math.min(LEVELS, Math.max(1, Math.ceil(((n - min) / (max - min)) * LEVELS)));
}

/**
 * The fewest and most fire times of a non-empty hour, the window's first and last hour left out:
 * the window starts now, so its first hour holds only the rest of that hour's fire times (119 of
 * an every-second job's 3,600), and as the lightest it would shade every full hour alike again.
 */
function scale(data) {
  const edges = new Set([data.windowStart, new Date(Date.parse(data.windowEnd) - 1).toISOString()].map((t) => localCell(t, data.timezone).join(" ")));
  const counts = data.days.flatMap((d) => d.hours.filter((n, hour) => n > 0 && !edges.has(`${d.date} ${hour}`)));
  const all = data.days.flatMap((d) => d.hours).filter((n) => n > 0);
  const used = counts.length ? counts : all; // a job that fires only in an edge hour
  return used.length ? [Math.min(...used), Math.max(...used)] : null;
}

function heatTable(data) {
  const [min, max] = scale(data) ?? [0, 0];
  const marked = new Map();
  for (const m of data.marks) {
    const key = localCell(m.at, data.timezone).join(" ");
    marked.set(key, [...(marked.get(key) ?? []), m]);
  }
  const weekday = (date) => new Date(`${date}T12:00:00Z`).toLocaleDateString("en-GB", { weekday: "short", timeZone: "UTC" });
  return h(
    "table",
    { class: "heat", id: "heatmap" },
    h("caption", {}, `Fire times per hour, ${data.timezone} wall clock; `, max ? `lightest = ${min.toLocaleString("en")}, darkest = ${max.toLocaleString("en")}. ` : "no fire time in these 7 days. ", h("span", { class: "dst-key" }, "◆"), " a DST change."),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Day"), Array.from({ length: 24 }, (_, i) => h("th", { scope: "col", class: "hour" }, String(i).padStart(2, "0"))))),
    h(
      "tbody",
      {},
      data.days.map((d) =>
        h(
          "tr",
          { dataset: { date: d.date } },
          h("th", { scope: "row" }, `${weekday(d.date)} ${d.date}`),
          d.hours.map((n, hour) => {
            const marks = marked.get(`${d.date} ${hour}`);
            const title = `${d.date} ${String(hour).padStart(2, "0")}:00 ${data.timezone}: ${n} fire time${n === 1 ? "" : "s"}${marks ? ` — DST: ${marks.map((m) => m.kind).join(", ")}` : ""}`;
            return h("td", { class: `l${level(n, min, max)}${marks ? " dst" : ""}`, title, dataset: { hour: String(hour), fires: String(n) } }, marks ? "◆" : n ? h("span", { class: "visually-hidden" }, String(n)) : null);
          }),
        ),
      ),
    ),
  );
}

/**
 * Arrow keys, Home and End move through the heatmap's cells (one tab stop: a roving tabindex),
 * and the focused cell's count is read out in `readout`.
 */
function keyboard(table, readout) {
  const cells = () => [...table.querySelectorAll("tbody td")];
  const rows = () => [...table.querySelectorAll("tbody tr")];
  const show = (td) => {
    for (const c of cells()) c.tabIndex = -1;
    td.tabIndex = 0;
    td.focus();
    readout.textContent = td.title;
  };
  const first = cells().find((c) => Number(c.dataset.fires) > 0) ?? cells()[0];
  if (first) first.tabIndex = 0;
  table.addEventListener("focusin", (e) => {
    if (e.target.matches("td")) readout.textContent = e.target.title;
  });
  table.addEventListener("keydown", (e) => {
    const td = e.target.closest("td");
    if (!td) return;
    const tr = td.parentElement;
    const r = rows().indexOf(tr);
    const c = [...tr.querySelectorAll("td")].indexOf(td);
    const at = (rr, cc) => rows()[rr]?.querySelectorAll("td")[cc];
    const next = { ArrowRight: at(r, c + 1), ArrowLeft: at(r, c - 1), ArrowDown: at(r + 1, c), ArrowUp: at(r - 1, c), Home: at(r, 0), End: at(r, 23) }[e.key];
    if (next) {
      e.preventDefault();
      show(next);
    }
  });
}

function marksList(data) {
  if (!data.marks.length) return h("p", { class: "muted", id: "dst-marks" }, "No fire time in these 7 days falls in a DST gap or fold.");
  return h(
    "table",
    { class: "grid", id: "dst-marks" },
    h("thead", {}, h("tr", {}, ["When (UTC)", `When (${data.timezone})`, "What happens", "Rule", "Schedule zone", "Jobs"].map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      {},
      data.marks.map((m) =>
        h(
          "tr",
          { dataset: { kind: m.kind } },
          h("td", { class: "t" }, inZone(m.at)),
          h("td", { class: "t" }, inZone(m.at, data.timezone)),
          h("td", {}, KIND_WORDS[m.kind] ?? m.kind),
          h("td", { class: "mono" }, m.rule),
          h("td", {}, m.timezone),
          h("td", {}, m.jobIds.flatMap((id, i) => [i ? ", " : "", h("a", { href: `/ui/jobs/${encodeURIComponent(id)}`, class: "mono" }, shortId(id))]), m.jobs > m.jobIds.length ? ` and ${m.jobs - m.jobIds.length} more` : ""),
        ),
      ),
    ),
  );
}

export function renderUpcoming(main, params) {
  const zone = params.get("timezone") || browserZone();
  const status = h("p", { class: "muted", role: "status", id: "upcoming-status" }, "Loading…");
  const body = h("div", { id: "upcoming-page" });
  const input = h("input", { id: "zone", name: "timezone", value: zone, list: "zones", size: 24, spellcheck: "false", autocomplete: "off" });
  const zones = typeof Intl.supportedValuesOf === "function" ? Intl.supportedValuesOf("timeZone") : [];
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Heatmap settings" },
    h("label", { for: "zone" }, "Time zone "),
    input,
    h("datalist", { id: "zones" }, ["UTC", ...zones].map((z) => h("option", { value: z }))),
    h("button", { type: "submit" }, "Show"),
  );
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams(params);
    // Zone names are case-sensitive (IANA): take the listed spelling of what was typed.
    const typed = input.value.trim() || "UTC";
    q.set("timezone", ["UTC", ...zones].find((z) => z.toLowerCase() === typed.toLowerCase()) ?? typed);
    navigate(`/ui/upcoming?${q}`);
  });
  main.append(h("h1", {}, "Upcoming"), form, status, body);
  let stopped = false;
  const q = new URLSearchParams({ timezone: zone });
  if (params.get("allUsers") === "true") q.set("allUsers", "true");
  let timer = null;
  const load = () => api(`/stats/upcoming?${q}`)
    .then((data) => {
      if (stopped) return;
      const busiest = data.busiestAt ? ` The busiest hour starts ${inZone(data.busiestAt, data.timezone)} with ${data.busiestFires}.` : "";
      status.textContent = `${data.fires.toLocaleString("en")} fire times of ${data.jobs} job${data.jobs === 1 ? "" : "s"} from ${inZone(data.windowStart, data.timezone)} to ${inZone(data.windowEnd, data.timezone)}.${busiest}${data.truncated ? " Counts are lower bounds (too many fire times)." : ""}`;
      const transitions = data.transitions.length
        ? h("ul", { id: "transitions" }, data.transitions.map((t) => h("li", {}, `${inZone(t.at, data.timezone)}: UTC${t.offsetBeforeSeconds >= 0 ? "+" : ""}${t.offsetBeforeSeconds / 3600} → UTC${t.offsetAfterSeconds >= 0 ? "+" : ""}${t.offsetAfterSeconds / 3600}`)))
        : null;
      const table = heatTable(data);
      const readout = h("p", { id: "heat-cell", class: "muted", role: "status", "aria-live": "polite" }, "Arrow keys move through the hours; each one's count shows here.");
      keyboard(table, readout);
      body.replaceChildren(
        table,
        readout,
        h("h2", {}, "DST changes"),
        transitions ?? h("p", { class: "muted" }, `${data.timezone} changes no offset in these 7 days.`),
        marksList(data),
      );
    })
    .catch((e) => {
      status.textContent = `Cannot load the upcoming fire times: ${e.message}`;
      status.classList.add("error");
    });
  // A job created, changed or deleted moves the heatmap: reload, at most once per 2 s.
  const soon = () => {
    if (!timer && !stopped) timer = setTimeout(() => { timer = null; load(); }, 2000);
  };
  const feed = new LiveFeed({ onEvent: (e) => e.kind === "job" && soon(), onState: liveState, onResync: soon }).start();
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
    feed.stop();
  };
}
