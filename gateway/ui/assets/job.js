// Job: its spec, its next fire times, its runs, and the controls, updated live.
import { api, LiveFeed, loadFresh, serialized, TERMINAL, tokenUser } from "./api.js";
import { badge, h, inZone, jobZone, outcomesWords, runKind, scheduleWords, shortId, webhookTarget, when } from "./format.js";
import { labelChips } from "./labels.js";
import { backfillSection } from "./backfill.js";
import { confirmAction, liveState, navigate } from "./shell.js";

const ACTIONS = [
  { name: "pause", label: "Pause", confirm: "No run starts until it is resumed.", allowed: (s) => s === "SCHEDULED" || s === "RUNNING" },
  { name: "resume", label: "Resume", confirm: "Its schedule continues from now.", allowed: (s) => s === "PAUSED" },
  { name: "trigger", label: "Trigger now", confirm: "One extra run starts now.", allowed: (s) => s !== "CANCELLED" },
  { name: "cancel", label: "Cancel", confirm: "No run starts again, ever; a running run is cancelled.", allowed: (s) => !["CANCELLED", "SUCCEEDED", "FAILED", "SKIPPED"].includes(s) },
  { name: "delete", label: "Delete", confirm: "The job and its run history are deleted (its audit records stay).", allowed: () => true, danger: true },
];

function value(v) {
  if (v === null || v === undefined) return h("span", { class: "muted" }, "—");
  if (typeof v === "object") return h("pre", { class: "json" }, JSON.stringify(v, null, 2));
  return String(v);
}

/** A webhook target in words: where (host only), on which outcomes, signed or not. */
export function notifyWords(target) {
  return h(
    "span",
    { class: "notify" },
    `on ${outcomesWords(target.on)} → `,
    h("span", { class: "mono", title: "path and query hidden: receivers often carry their token there" }, webhookTarget(target.url)),
    target.hasSecret ? " · signed (the secret is never shown)" : " · unsigned",
  );
}

function notifyCell(job, fallback) {
  if (job.notify) return notifyWords(job.notify);
  if (fallback === undefined) return h("span", { class: "muted" }, "none on this job: the owner's default webhook applies, if set");
  if (fallback === null) return h("span", { class: "muted" }, "none (no webhook on this job and no default of yours)");
  return h("span", {}, notifyWords(fallback), h("span", { class: "muted" }, " (your default: the job sets none)"));
}

function concurrencyWords(job) {
  if (!job.concurrencyKey) return h("span", { class: "muted" }, "no limit");
  const policy = job.concurrencyPolicy === "skip" ? "skip (a run finding every slot taken ends SKIPPED)" : "queue (waits for a slot, in order)";
  return h(
    "span",
    {},
    "key ",
    h("code", {}, job.concurrencyKey),
    `, at most ${job.maxConcurrent} at once, policy ${policy}`,
  );
}

function spec(job, defaultNotify) {
  const s = job.schedule;
  const rows = [
    ["Name", job.name],
    ["Labels", labelChips(job.labels) ?? h("span", { class: "muted" }, "none")],
    ["Task", job.taskId],
    ["Schedule", scheduleWords(s)],
    ["Schedule (as stored, defaults filled in)", s],
    ["Parameters", job.parameters],
    ["Queue", job.queue],
    ["Max attempts", job.maxAttempts],
    ["Timeout", `${job.timeoutSeconds} s`],
    ["Misfire policy", `${job.misfirePolicy} (grace ${job.misfireGraceSeconds} s, catch-up at most ${job.maxCatchUp})`],
    ["Overlap policy", job.overlapPolicy],
    ["Concurrency", concurrencyWords(job)],
    ["Notifications", notifyCell(job, defaultNotify)],
    ["Start / end", s.startAt || s.endAt ? `${inZone(s.startAt)} → ${inZone(s.endAt)}` : null],
    ["Jitter", s.jitterSeconds ? `${s.jitterSeconds} s` : null],
    ["History kept", `${job.historyLimit ?? "the deployment's default number of"} finished runs, for ${job.historyMaxAgeSeconds === null ? "the deployment's default age" : `${job.historyMaxAgeSeconds} s`}`],
    ["Created", when(job.createdAt)],
    ["Owner", job.owner],
    ["Idempotency key", job.idempotencyKey],
  ];
  return h("dl", { class: "spec" }, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v instanceof Node ? v : value(v))]));
}

function summary(job) {
  const zone = jobZone(job);
  return h(
    "dl",
    { class: "summary", id: "job-summary" },
    h("dt", {}, "Status"),
    h("dd", { id: "job-status" }, badge(job.status)),
    h("dt", {}, "Next run"),
    h("dd", {}, when(job.nextRunAt, zone)),
    h("dt", {}, "Last run"),
    h("dd", {}, job.lastRunStatus ? [badge(job.lastRunStatus), " "] : null, job.lastRunAt ? ["started ", when(job.lastRunAt, zone)] : h("span", { class: "muted" }, "—")),
    h("dt", {}, "Runs"),
    h("dd", { id: "job-run-count" }, String(job.runCount)),
    job.lastError ? [h("dt", {}, "Last error"), h("dd", { class: "error" }, job.lastError)] : null,
  );
}

const DST_WORDS = {
  shifted: "DST gap: runs at its end",
  skipped: "DST gap: does not run",
  "fold-first": "DST fold: 1st pass",
  "fold-second": "DST fold: 2nd pass",
};

function upcomingTable(times, zone, marks = []) {
  if (!times.length) return h("p", { class: "muted" }, "No run is scheduled.");
  const zones = zone === "UTC" ? ["UTC"] : ["UTC", zone];
  const byTime = new Map(marks.filter((m) => m.kind !== "skipped").map((m) => [m.at, m]));
  const rows = times.map((t) => ({ t, mark: byTime.get(t) ?? null, skipped: false }));
  for (const m of marks.filter((m) => m.kind === "skipped")) rows.push({ t: m.at, mark: m, skipped: true });
  rows.sort((a, b) => new Date(a.t) - new Date(b.t));
  const note = (r) => (r.mark ? h("span", { class: "dst-mark" }, `◆ ${DST_WORDS[r.mark.kind] ?? r.mark.kind} (${r.mark.rule})`) : null);
  return h(
    "table",
    { class: "grid", id: "upcoming" },
    h("thead", {}, h("tr", {}, zones.map((z) => h("th", { scope: "col" }, z)))),
    h(
      "tbody",
      {},
      rows.map((r) =>
        h(
          "tr",
          { class: r.skipped ? "skipped-occurrence" : null, dataset: r.mark ? { dst: r.mark.kind } : {} },
          // The DST note goes under the time in the job's zone, where the rule applies: a third
          // column pushed the table past the right edge of a 1360-pixel window.
          zones.map((z, i) => h("td", { class: "t" }, r.skipped ? h("s", {}, inZone(r.t, z)) : inZone(r.t, z), i === zones.length - 1 ? note(r) : null)),
        ),
      ),
    ),
  );
}

const recurring = (job) => job.schedule.type === "cron" || job.schedule.type === "interval";

// An execution id in a reason (core/ids.py: 32 hex digits of the job, ':', the scheduled instant).
const EXECUTION_ID = /\b([0-9a-f]{32}):(\d{4}-\d\d-\d\dT[\d:.]+Z)/g;

/** A run's error or skip reason; an execution id in it ("previous run <id> is still RUNNING")
 * shows as a link to that run, labelled with its scheduled time in the job's zone. */
function reason(run, job, zone) {
  if (run.status !== "SKIPPED") return run.error ?? "";
  const missed = run.missed ? ` — ${run.missed.count} missed (${inZone(run.missed.first)} … ${inZone(run.missed.last)}), policy ${run.missed.policy}` : "";
  const text = `${run.skipReason ?? "skipped"}${missed}`;
  const out = [];
  let last = 0;
  for (const m of text.matchAll(EXECUTION_ID)) {
    out.push(text.slice(last, m.index));
    const href = m[1] === job.id ? `/ui/jobs/${encodeURIComponent(job.id)}/runs/${encodeURIComponent(m[0])}` : null;
    const label = inZone(m[2], zone);
    out.push(href ? h("a", { href, title: m[0] }, label) : h("span", { title: m[0] }, label));
    last = m.index + m[0].length;
  }
  out.push(text.slice(last));
  return out;
}

function runsTable(job, runs) {
  if (!runs.length) return h("p", { class: "muted", id: "runs" }, "No runs yet.");
  const zone = jobZone(job);
  return h(
    "table",
    { class: "grid", id: "runs" },
    h("thead", {}, h("tr", {}, ["Scheduled for", "Trigger", "Status", "Attempt", "Started", "Finished", "Worker", "Error or reason"].map((t) => h("th", { scope: "col" }, t)))),
    h(
      "tbody",
      {},
      runs.map((r) =>
        h(
          "tr",
          { id: `run-${r.id}`, dataset: { status: r.status } },
          h("td", {}, h("a", { href: `/ui/jobs/${encodeURIComponent(job.id)}/runs/${encodeURIComponent(r.id)}`, class: "t" }, inZone(r.scheduledFor, zone))),
          h("td", { class: "trigger" }, r.trigger, runKind(r)),
          h("td", { class: "status" }, badge(r.status)),
          h("td", { class: "num" }, `${r.attempt}/${r.maxAttempts}`),
          h("td", { class: "t" }, r.startedAt ? inZone(r.startedAt, zone) : "—"),
          h("td", { class: "t" }, r.finishedAt ? inZone(r.finishedAt, zone) : "—"),
          h("td", { class: "mono" }, r.workerId ?? "—"),
          h("td", { class: r.status === "SKIPPED" ? "muted reason" : "error reason" }, reason(r, job, zone)),
        ),
      ),
    ),
  );
}

export function renderJob(main, jobId) {
  const base = `/jobs/${encodeURIComponent(jobId)}`;
  const title = h("h1", {}, "Job");
  const head = h("div", { id: "job-head" });
  const controls = h("div", { class: "controls", role: "group", "aria-label": "Job controls" });
  const message = h("p", { role: "status", "aria-live": "polite", id: "job-message", class: "message" });
  const upcoming = h("section", { "aria-labelledby": "upcoming-title" }, h("h2", { id: "upcoming-title" }, "Next 10 fire times"), h("div", { id: "upcoming-body" }));
  const history = h("section", { "aria-labelledby": "runs-title" }, h("h2", { id: "runs-title" }, "Runs"), h("div", { id: "runs-body" }), h("nav", { class: "pager", id: "runs-pager" }));
  const specBox = h("section", { "aria-labelledby": "spec-title" }, h("h2", { id: "spec-title" }, "Spec"), h("div", { id: "spec-body" }));
  const backfill = backfillSection(base, () => job, () => refresh());
  backfill.hidden = true;
  main.append(h("p", {}, h("a", { href: "/ui/" }, "« Jobs")), title, head, controls, message, h("div", { class: "columns" }, specBox, upcoming), backfill, history);

  let stopped = false;
  let job = null;
  let runsCursor = null;

  // The buttons are made once and only enabled or disabled after: a live update that rebuilt
  // them dropped the keyboard focus to the page's body.
  function showControls() {
    if (!controls.childElementCount) {
      controls.replaceChildren(
        ...ACTIONS.map((a) =>
          h("button", {
            type: "button",
            id: `action-${a.name}`,
            class: a.danger ? "danger" : null,
            onclick: () => act(a),
          }, a.label),
        ),
      );
    }
    for (const a of ACTIONS) document.getElementById(`action-${a.name}`).disabled = !a.allowed(job.status);
  }

  /** Keep the focus on `button` if it can still be used, else on the first control that can. */
  function refocus(button) {
    if (!button.disabled) button.focus();
    else controls.querySelector("button:not(:disabled)")?.focus();
  }

  async function act(a) {
    const ok = await confirmAction(`${a.label}: ${job.name ?? `${job.taskId} · ${shortId(job.id)}`}`, a.confirm, a.label);
    if (!ok) return;
    try {
      if (a.name === "delete") {
        await api(base, { method: "DELETE" });
        navigate("/ui/");
        return;
      }
      await api(`${base}/${a.name}`, { method: "POST" });
      message.textContent = `${a.label}: done.`;
      message.classList.remove("error");
      await refresh();
      refocus(document.getElementById(`action-${a.name}`));
    } catch (e) {
      message.textContent = `${a.label}: ${e.message}`;
      message.classList.add("error");
    }
  }

  async function loadJob() {
    job = await api(base);
    if (stopped) return;
    // the owner's default webhook applies to a job without one; only the owner can read it
    const fallback = job.notify || job.owner !== tokenUser() ? undefined : (await api("/me/notifications").catch(() => ({ notify: undefined }))).notify;
    if (stopped) return;
    title.textContent = job.name ?? job.taskId;
    title.append(" ", h("span", { class: "muted mono" }, job.name ? `${job.taskId} · ${shortId(job.id)}` : shortId(job.id)));
    head.replaceChildren(summary(job));
    document.getElementById("spec-body").replaceChildren(spec(job, fallback));
    showControls();
    backfill.hidden = !recurring(job);
    document.getElementById("backfill-policy").options[0].textContent = `the job's (${job.overlapPolicy})`;
    const next = job.nextRunAt ? await api(`${base}/upcoming?count=10`) : { fireTimes: [], marks: [] };
    if (!stopped) document.getElementById("upcoming-body").replaceChildren(upcomingTable(next.fireTimes, jobZone(job), next.marks ?? []));
  }

  async function loadRuns() {
    const q = new URLSearchParams({ limit: "20" });
    if (runsCursor) q.set("cursor", runsCursor);
    const page = await api(`${base}/executions?${q}`);
    if (stopped) return page;
    document.getElementById("runs-body").replaceChildren(runsTable(job, page.items));
    const pager = document.getElementById("runs-pager");
    const links = [];
    if (runsCursor) links.push(h("button", { type: "button", onclick: () => { runsCursor = null; loadRuns(); } }, "« Newest runs"));
    if (page.nextCursor) links.push(h("button", { type: "button", onclick: () => { runsCursor = page.nextCursor; loadRuns(); } }, "Older runs »"));
    const focused = pager.contains(document.activeElement) ? document.activeElement.textContent : null;
    pager.replaceChildren(...links);
    if (focused) (links.find((b) => b.textContent === focused) ?? links[0])?.focus();
    return page;
  }

  async function load() {
    await loadJob();
    await loadRuns();
  }

  const latest = new Map(); // execution id → the latest run status an event told
  const refresh = serialized(async () => {
    await loadJob();
    if (runsCursor || stopped) return;
    await loadFresh(loadRuns, (page) =>
      [...latest].every(([id, status]) => {
        const run = page.items.find((r) => r.id === id);
        return !run || run.status === status || TERMINAL.has(run.status);
      }),
    );
    await loadJob(); // the job's status and last run, as the recorder wrote them with the run
  });
  function onEvent(event) {
    if (event.kind === "job" && event.event === "deleted") {
      message.textContent = "This job was deleted.";
      controls.replaceChildren();
      return;
    }
    if (event.kind === "run") latest.set(event.executionId, event.status);
    refresh();
  }

  function show() {
    load().catch((e) => {
      if (e.status === 404) feed.stop(); // nothing of it will come
      title.textContent = e.status === 404 ? "Job not found" : "Cannot load the job";
      if (e.status === 404) for (const el of [specBox, upcoming, backfill, history, controls]) el.hidden = true;
      message.textContent = e.message;
      message.classList.add("error");
    });
  }
  const feed = new LiveFeed({ jobIds: [jobId], onEvent, onState: liveState, onResync: show }).start();
  show();
  return () => {
    stopped = true;
    feed.stop();
  };
}
