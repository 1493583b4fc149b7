// Presentation: DOM building, times, schedules in words.

/** An element: h("a", {href: "/x", class: "y"}, "text", child, …). Text is never parsed as HTML. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

const pad = (n) => String(n).padStart(2, "0");

/** "2026-12-02 08:00:00" of an instant in an IANA zone (default UTC). */
export function inZone(iso, timeZone = "UTC") {
  if (!iso) return "—";
  const parts = Object.fromEntries(
    new Intl.DateTimeFormat("en-GB", {
      timeZone,
      year: "numeric",
      month: "2-digit",
      day: "2-digit",
      hour: "2-digit",
      minute: "2-digit",
      second: "2-digit",
      hourCycle: "h23",
      timeZoneName: "short",
    })
      .formatToParts(new Date(iso))
      .map((p) => [p.type, p.value]),
  );
  return `${parts.year}-${parts.month}-${parts.day} ${parts.hour}:${parts.minute}:${parts.second} ${parts.timeZoneName}`;
}

/** "in 3 min", "12 s ago" relative to now. */
export function relative(iso, now = Date.now()) {
  if (!iso) return "";
  const s = Math.round((new Date(iso).getTime() - now) / 1000);
  const a = Math.abs(s);
  let text;
  if (a < 60) text = `${a} s`;
  else if (a < 3600) text = `${Math.round(a / 60)} min`;
  else if (a < 86400 * 2) text = `${Math.round(a / 3600)} h`;
  else if (a < 86400 * 365 * 2) text = `${Math.round(a / 86400)} d`;
  else text = `${Math.round(a / (86400 * 365.25))} years`;
  return a < 1 ? "now" : s > 0 ? `in ${text}` : `${text} ago`;
}

/** A <time> with the absolute UTC instant and its relative distance, refreshed by tick(). */
export function when(iso, timeZone = "UTC") {
  if (!iso) return h("span", { class: "muted" }, "—");
  return h(
    "time",
    { datetime: iso, title: iso },
    inZone(iso, timeZone),
    " ",
    h("span", { class: "rel", dataset: { rel: iso } }, `(${relative(iso)})`),
  );
}

/** Refresh every relative time on the page (the clock moves; no request is made). */
export function tick() {
  for (const el of document.querySelectorAll("[data-rel]")) {
    el.textContent = `(${relative(el.dataset.rel)})`;
  }
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${+seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
  if (seconds < 7200) return `${+(seconds / 60).toFixed(1)} min`;
  if (seconds < 172800) return `${+(seconds / 3600).toFixed(1)} h`;
  return `${+(seconds / 86400).toFixed(1)} d`;
}

export function between(fromIso, toIso) {
  if (!fromIso || !toIso) return null;
  return (new Date(toIso).getTime() - new Date(fromIso).getTime()) / 1000;
}

export function badge(status) {
  if (!status) return h("span", { class: "muted" }, "—");
  return h("span", { class: `badge s-${status.toLowerCase()}` }, status);
}

const DAYS = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const DAY_NAMES = { SUN: 0, MON: 1, TUE: 2, WED: 3, THU: 4, FRI: 5, SAT: 6 };

function dayOf(token) {
  const n = DAY_NAMES[token.toUpperCase()] ?? Number(token);
  return Number.isInteger(n) && n >= 0 && n <= 7 ? DAYS[n] : null;
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

function monthOf(token) {
  const i = MONTHS.findIndex((m) => m.toUpperCase() === token.toUpperCase());
  const n = i >= 0 ? i + 1 : Number(token);
  return Number.isInteger(n) && n >= 1 && n <= 12 ? MONTHS[n - 1] : null;
}

/** A list of values and ranges ("1-5,0", "MAR-MAY") in words by ``name``, or null. */
function listInWords(field, name) {
  const words = [];
  for (const part of field.split(",")) {
    const [lo, hi, extra] = part.split("-");
    if (extra !== undefined) return null;
    const a = name(lo);
    const b = hi === undefined ? null : name(hi);
    if (!a || (hi !== undefined && !b)) return null;
    words.push(b ? `${a}–${b}` : a);
  }
  return words.join(", ");
}

function daysInWords(field) {
  if (field === "*" || field === "?") return "every day";
  return listInWords(field, dayOf);
}

/** "08:00", "08:00, 12:30" or "every 2 hours at :15" of a cron's minute and hour fields. */
function timesInWords(min, hour) {
  if (!isNum(min)) return null;
  const step = /^(?:\*|0)\/(\d+)$/.exec(hour);
  if (step) return `every ${step[1]} hours at :${pad(min)}`;
  const hours = hour.split(",");
  if (hours.length > 4 || !hours.every((x) => isNum(x) && Number(x) < 24)) return null;
  return hours.map((x) => `${pad(x)}:${pad(min)}`).join(", ");
}

const isNum = (s) => /^\d+$/.test(s);

/** A cron expression in words where it is a common shape; null otherwise. */
export function cronWords(expression) {
  const macros = {
    "@yearly": "yearly",
    "@annually": "yearly",
    "@monthly": "monthly",
    "@weekly": "weekly",
    "@daily": "daily at 00:00",
    "@midnight": "daily at 00:00",
    "@hourly": "hourly at :00",
  };
  if (macros[expression]) return macros[expression];
  const f = expression.trim().split(/\s+/);
  if (f.length !== 5) return null;
  const [min, hour, dom, mon, dow] = f;
  const months = mon === "*" ? "" : listInWords(mon, monthOf);
  if (months === null) return null;
  const within = months ? ` in ${months}` : "";
  if (dom === "*" && dow === "*") {
    if (min === "*" && hour === "*") return `every minute${within}`;
    const step = /^\*\/(\d+)$/.exec(min);
    if (step && hour === "*") return `every ${step[1]} minutes${within}`;
    if (isNum(min) && hour === "*") return `hourly at :${pad(min)}${within}`;
  }
  const time = timesInWords(min, hour);
  if (!time) return null;
  if (dom === "*") {
    const days = daysInWords(dow);
    if (!days) return null;
    return time.startsWith("every") && dow === "*" ? `${time}${within}` : `${time} ${days}${within}`;
  }
  if (isNum(dom) && dow === "*") return `${time} on day ${dom} of ${months ? months : "each month"}`;
  return null;
}

function seconds(s) {
  if (s % 86400 === 0) return s === 86400 ? "day" : `${s / 86400} days`;
  if (s % 3600 === 0) return s === 3600 ? "hour" : `${s / 3600} h`;
  if (s % 60 === 0) return s === 60 ? "minute" : `${s / 60} min`;
  return `${s} s`;
}

/** A job's schedule in words, with its time zone: "08:00 Mon–Fri, Europe/Berlin". */
export function scheduleWords(schedule) {
  switch (schedule.type) {
    case "immediate":
      return "once, immediately";
    case "once":
      return `once at ${inZone(schedule.executeAt)}`;
    case "interval":
      return `every ${seconds(schedule.everySeconds)}`;
    case "cron": {
      const words = cronWords(schedule.expression) ?? `cron ${schedule.expression}`;
      return `${words}, ${schedule.timezone ?? "UTC"}`;
    }
    default:
      return schedule.type;
  }
}

/** The zone a job's times read best in (cron: its zone; others UTC). */
export function jobZone(job) {
  return job.schedule.type === "cron" ? job.schedule.timezone ?? "UTC" : "UTC";
}

export function shortId(id) {
  return id.length > 12 ? `${id.slice(0, 12)}…` : id;
}

/**
 * A webhook URL as the dashboard shows it: scheme, host and port; the path and query elided
 * ("https://ops.example.com/…"), since many receivers (chat webhooks) carry their token there.
 * The signing secret never reaches the page (the API answers `hasSecret` only).
 */
export function webhookTarget(url) {
  try {
    const u = new URL(url);
    return `${u.origin}${u.pathname === "/" && !u.search ? "/" : "/…"}`;
  } catch {
    return "(not a URL)";
  }
}

/** "failure", "success" or "failure and success" of a notify target's `on`. */
export function outcomesWords(on) {
  const set = new Set(on ?? ["failure"]);
  return ["failure", "success"].filter((o) => set.has(o)).join(" and ");
}

/** The marks of a run that is a replay or a backfill (a chip after its trigger), or null. */
export function runKind(run) {
  if (run.replayOf) return h("span", { class: "kind kind-replay", title: `replays ${run.replayOf}` }, "replay");
  if (run.backfill) return h("span", { class: "kind kind-backfill", title: "created by a backfill for a past occurrence" }, "backfill");
  return null;
}
