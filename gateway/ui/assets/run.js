// Run: one execution's attempts, worker, error and result, updated live.
import { api, LiveFeed, loadFresh, serialized, TERMINAL } from "./api.js";
import { badge, between, duration, h, inZone, jobZone } from "./format.js";
import { liveState } from "./shell.js";

function field(name, v) {
  return [h("dt", {}, name), h("dd", {}, v === null || v === undefined || v === "" ? h("span", { class: "muted" }, "—") : v)];
}

function timeline(run, zone) {
  const steps = [["scheduled", run.scheduledFor], ["published", run.publishedAt]];
  for (const a of run.attempts) {
    steps.push([`attempt ${a.attempt} started${a.redelivered ? " (redelivered)" : ""} on ${a.workerId ?? "?"}`, a.startedAt]);
    if (a.finishedAt) steps.push([`attempt ${a.attempt} ${a.outcome ?? "ended"}`, a.finishedAt]);
  }
  if (run.nextAttemptAt && !TERMINAL.has(run.status)) steps.push(["next attempt due", run.nextAttemptAt]);
  if (!run.attempts.length && run.finishedAt) steps.push([run.status.toLowerCase(), run.finishedAt]);
  const known = steps.filter(([, t]) => t);
  return h(
    "ol",
    { class: "timeline", id: "timeline" },
    known.map(([label, t], i) =>
      h("li", {}, h("span", { class: "t" }, inZone(t, zone)), " ", label,
        i ? h("span", { class: "muted" }, ` (+${duration(between(known[i - 1][1], t))})`) : null),
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

export function renderRun(main, jobId, executionId) {
  const base = `/jobs/${encodeURIComponent(jobId)}`;
  const title = h("h1", {}, "Run");
  const body = h("div", { id: "run-body" }, h("p", { class: "muted" }, "Loading…"));
  main.append(h("p", {}, h("a", { href: `/ui/jobs/${encodeURIComponent(jobId)}` }, "« Job")), title, body);
  let stopped = false;
  let latest = null;

  async function load() {
    const [job, run] = await Promise.all([api(base), api(`${base}/executions/${encodeURIComponent(executionId)}`)]);
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
