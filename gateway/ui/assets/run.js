// Run: one execution's attempts, worker, error and result, updated live.
import { api, LiveFeed, loadFresh, serialized, TERMINAL } from "./api.js";
import { badge, between, duration, h, inZone, jobZone, runKind, shortId, webhookTarget } from "./format.js";
import { liveState } from "./shell.js";

function field(name, v) {
  return [h("dt", {}, name), h("dd", {}, v === null || v === undefined || v === "" ? h("span", { class: "muted" }, "—") : v)];
}

function timeline(run, zone) {
  // [label, instant, whether the wait before it is a retry's backoff]
  const steps = [["scheduled", run.scheduledFor, false], ["published", run.publishedAt, false]];
  let retrying = false;
  for (const a of run.attempts) {
    steps.push([`attempt ${a.attempt} started${a.redelivered ? " (redelivered)" : ""} on ${a.workerId ?? "?"}`, a.startedAt, retrying]);
    if (a.finishedAt) steps.push([`attempt ${a.attempt} ${a.outcome ?? "ended"}`, a.finishedAt, false]);
    retrying = a.outcome === "RETRYING";
  }
  if (run.nextAttemptAt && !TERMINAL.has(run.status)) steps.push(["next attempt due", run.nextAttemptAt, retrying]);
  if (!run.attempts.length && run.finishedAt) steps.push([run.status.toLowerCase(), run.finishedAt, false]);
  const known = steps.filter(([, t]) => t);
  const gap = (i) => {
    const [, t, backoff] = known[i];
    const d = duration(between(known[i - 1][1], t));
    const title = `${d} after the step before; ${duration(between(known[0][1], t))} after the scheduled time`;
    return backoff
      ? h("span", { class: "backoff-gap", title }, `backoff ${d} before the retry`)
      : h("span", { class: "muted", title }, ` (+${d} after the step before)`);
  };
  return h(
    "ol",
    { class: "timeline", id: "timeline" },
    known.map(([label, t, backoff], i) =>
      h("li", { class: backoff && i ? "after-backoff" : null }, i && backoff ? gap(i) : null, h("span", { class: "t" }, inZone(t, zone)), " ", label, i && !backoff ? gap(i) : null),
    ),
  );
}

function attemptsTable(run, zone) {
  if (!run.attempts.length) return h("p", { class: "muted", id: "attempts" }, "No attempt has started.");
  return h(
    "table",
    { class: "grid", id: "attempts" },
    h("thead", {}, h("tr", {}, ["#", "Started", "Finished", "Took", "Worker", "Outcome", "Error"].map((t) => h("th", { scope: "col" }, t)))),
    h(
      "tbody",
      {},
      run.attempts.map((a) =>
        h(
          "tr",
          {},
          h("td", { class: "num" }, String(a.attempt), a.redelivered ? h("span", { class: "muted", title: "its worker was lost; JetStream redelivered the run" }, " ↻") : null),
          h("td", {}, inZone(a.startedAt, zone)),
          h("td", {}, inZone(a.finishedAt, zone)),
          h("td", {}, duration(between(a.startedAt, a.finishedAt))),
          h("td", { class: "mono" }, a.workerId ?? "—"),
          h("td", {}, badge(a.outcome)),
          h("td", { class: "error" }, a.error ?? ""),
        ),
      ),
    ),
  );
}

const AUDIT_PAGES = 5;
const AUDIT_PAGE = 100;

/**
 * The replays of run `executionId`, from the job's audit trail (a `replayed` record names the
 * new run and the one it replays), newest first: `{ items, complete }`, where `complete` is
 * false when the trail is longer than the AUDIT_PAGES × AUDIT_PAGE records read.
 */
async function replaysOf(base, executionId) {
  const items = [];
  let cursor = null;
  for (let i = 0; i < AUDIT_PAGES; i++) {
    const q = new URLSearchParams({ limit: String(AUDIT_PAGE) });
    if (cursor) q.set("cursor", cursor);
    const page = await api(`${base}/audit?${q}`);
    items.push(...page.items.filter((r) => r.action === "replayed" && r.replayOf === executionId && r.executionId));
    cursor = page.nextCursor;
    if (!cursor) return { items, complete: true };
  }
  return { items, complete: false };
}

function runLink(jobId, id, text) {
  return h("a", { href: `/ui/jobs/${encodeURIComponent(jobId)}/runs/${encodeURIComponent(id)}`, class: "mono" }, text ?? shortRunId(id));
}

/** A run id without its job id prefix ("<job id>:<time>" → "…:<time>"). */
function shortRunId(id) {
  const i = id.indexOf(":");
  return i > 0 ? `…${id.slice(i)}` : shortId(id);
}

function kindField(jobId, run) {
  if (run.replayOf) return field("Replay of", h("span", { id: "replay-of" }, runKind(run), " ", runLink(jobId, run.replayOf)));
  if (run.backfill) return field("Backfill", h("span", { id: "backfill-mark" }, runKind(run), " created by a backfill for this past occurrence"));
  return null;
}

function replaysField(jobId, replays, zone) {
  if (!replays) return null; // the trail could not be read
  const list = replays.items.length
    ? h("ul", { class: "plain", id: "replays" }, replays.items.map((r) => h("li", {}, runLink(jobId, r.executionId), h("span", { class: "muted" }, ` by ${r.actor}, ${inZone(r.at, zone)}`))))
    : h("span", { class: "muted", id: "replays" }, "none");
  return field("Replays", [list, replays.complete ? null : h("div", { class: "muted" }, `(from the job's latest ${AUDIT_PAGES * AUDIT_PAGE} audit records)`)]);
}

function notificationsTable(attempts, zone) {
  if (!attempts) return h("p", { class: "muted", id: "notifications" }, "The notification attempts cannot be read.");
  if (!attempts.length) return h("p", { class: "muted", id: "notifications" }, "No webhook notification was sent for this run (none asked for its outcome, or not yet).");
  return h(
    "table",
    { class: "grid", id: "notifications" },
    h("thead", {}, h("tr", {}, ["#", "At", "Result", "HTTP status", "Error", "Took", "Next attempt", "To", "Event"].map((t) => h("th", { scope: "col" }, t)))),
    h(
      "tbody",
      {},
      attempts.map((a) =>
        h(
          "tr",
          { dataset: { ok: String(a.ok) } },
          h("td", { class: "num" }, String(a.attempt)),
          h("td", { class: "t" }, inZone(a.at, zone)),
          h("td", {}, h("span", { class: `badge ${a.ok ? "s-succeeded" : "s-failed"}` }, a.ok ? "delivered" : "failed")),
          h("td", { class: "num" }, a.statusCode === null ? "—" : String(a.statusCode)),
          h("td", { class: "error" }, a.error ?? ""),
          h("td", {}, duration(a.durationMs / 1000)),
          h("td", { class: "t" }, a.nextAttemptAt ? inZone(a.nextAttemptAt, zone) : "—"),
          h("td", { class: "mono", title: "path and query hidden" }, webhookTarget(a.url)),
          h("td", { class: "mono" }, a.eventType),
        ),
      ),
    ),
  );
}

export function renderRun(main, jobId, executionId) {
  const base = `/jobs/${encodeURIComponent(jobId)}`;
  const title = h("h1", {}, "Run");
  const body = h("div", { id: "run-body" }, h("p", { class: "muted" }, "Loading…"));
  main.append(h("p", {}, h("a", { href: `/ui/jobs/${encodeURIComponent(jobId)}` }, "« Job")), title, body);
  let stopped = false;
  let latest = null;

  async function load() {
    const runPath = `${base}/executions/${encodeURIComponent(executionId)}`;
    const [job, run, replays, attempts] = await Promise.all([
      api(base),
      api(runPath),
      replaysOf(base, executionId).catch(() => null),
      api(`${runPath}/notifications`).then((p) => p.items, () => null),
    ]);
    if (stopped) return run;
    const zone = jobZone(job);
    title.textContent = `Run of ${job.taskId} `;
    title.append(h("span", { class: "muted" }, `for ${inZone(run.scheduledFor, zone)}`));
    body.replaceChildren(
      h(
        "dl",
        { class: "summary", id: "run-summary" },
        field("Status", badge(run.status)),
        field("Trigger", run.trigger),
        kindField(jobId, run),
        replaysField(jobId, replays, zone),
        field("Scheduled for", zone === "UTC" ? inZone(run.scheduledFor) : `${inZone(run.scheduledFor)} · ${inZone(run.scheduledFor, zone)}`),
        field("Delay to start", run.startedAt ? duration(between(run.scheduledFor, run.startedAt)) : null),
        field("Attempt", `${run.attempt} of ${run.maxAttempts}`),
        field("Worker", run.workerId ? h("span", { class: "mono" }, run.workerId) : null),
        field("Queue", run.queue),
        field("Error", run.error ? h("span", { class: "error" }, run.error) : null),
        run.status === "SKIPPED" ? field("Skipped because", `${run.skipReason ?? ""}${run.missed ? ` (${run.missed.count} missed, policy ${run.missed.policy})` : ""}`) : null,
        field("Result", run.result === null ? null : h("pre", { class: "json", id: "run-result" }, JSON.stringify(run.result, null, 2))),
        field("Execution id", h("span", { class: "mono" }, run.id)),
      ),
      h("h2", {}, "Timeline"),
      timeline(run, zone),
      h("h2", {}, "Attempts"),
      attemptsTable(run, zone),
      h("h2", {}, "Webhook notification"),
      notificationsTable(attempts, zone),
    );
    return run;
  }

  const refresh = serialized(() => loadFresh(load, (run) => !latest || run.status === latest || TERMINAL.has(run.status)));
  const feed = new LiveFeed({
    jobIds: [jobId],
    onEvent: (event) => {
      if (event.kind !== "run" || event.executionId !== executionId) return;
      latest = event.status;
      refresh();
    },
    onState: liveState,
    onResync: () => show(),
  }).start();
  function show() {
    load().catch((e) => {
      if (e.status === 404) feed.stop(); // nothing of it will come
      title.textContent = e.status === 404 ? "Run not found" : "Cannot load the run";
      body.replaceChildren(h("p", { class: "error" }, e.message));
    });
  }
  show();
  return () => {
    stopped = true;
    feed.stop();
  };
}
