// Jobs: the user's jobs, filtered by the URL's query, a page at a time, updated live.
import { api, LiveFeed, loadFresh, serialized, TERMINAL, tokenRole } from "./api.js";
import { badge, h, jobZone, scheduleWords, shortId, when } from "./format.js";
import { labelChips, selectorMatches } from "./labels.js";
import { liveState, navigate } from "./shell.js";

const JOB_STATUSES = ["SCHEDULED", "RUNNING", "PAUSED", "SUCCEEDED", "FAILED", "SKIPPED", "CANCELLED"];
const JOB_ID = /^[0-9a-f]{32}$/i;
const RUN_STATUSES = ["QUEUED", "RUNNING", "RETRYING", "SUCCEEDED", "FAILED", "CANCELLED", "SKIPPED"];
const FILTERS = { status: "status", lastRunStatus: "lastRunStatus", task: "taskId", name: "name", labels: "labels", createdFrom: "startTime", createdTo: "endTime", allUsers: "allUsers" };
// URL query name → API query name. The URL keeps the dashboard's names so a link reads well.
const FILTERS_BY_API = Object.fromEntries(Object.entries(FILTERS).map(([url, api]) => [api, url]));

function apiQuery(params) {
  const q = new URLSearchParams();
  for (const [name, apiName] of Object.entries(FILTERS)) {
    const v = params.get(name);
    if (!v) continue;
    // a date from the date picker is the start of that day in UTC (the API takes RFC 3339)
    q.set(apiName, /^\d{4}-\d\d-\d\d$/.test(v) ? `${v}T00:00:00Z` : v);
  }
  if (params.get("cursor")) q.set("cursor", params.get("cursor"));
  q.set("limit", params.get("limit") || "50");
  return q;
}

function select(name, label, values, current) {
  return h(
    "label",
    {},
    `${label} `,
    h(
      "select",
      { name, id: `filter-${name}` },
      h("option", { value: "" }, "any"),
      values.map((v) => h("option", { value: v, selected: v === current }, v)),
    ),
  );
}

function row(job, showOwner = false) {
  const zone = jobZone(job);
  const href = `/ui/jobs/${encodeURIComponent(job.id)}`;
  return h(
    "tr",
    { id: `job-${job.id}`, dataset: { jobId: job.id } },
    h(
      "td",
      { class: "job" },
      h("a", { href }, job.name ?? job.taskId),
      job.name ? h("div", { class: "muted task" }, `task ${job.taskId}`) : null,
      h("div", { class: "muted mono" }, shortId(job.id)),
      showOwner ? h("div", { class: "muted owner" }, `owner ${job.owner}`) : null,
    ),
    h("td", { class: "labels" }, labelChips(job.labels) ?? h("span", { class: "muted" }, "—")),
    h("td", { class: "schedule" }, scheduleWords(job.schedule)),
    h("td", { class: "status" }, badge(job.status)),
    h("td", { class: "next" }, when(job.nextRunAt, zone)),
    h(
      "td",
      { class: "last" },
      // a job's first run still going: it has a start time (lastRunAt) and no outcome yet
      job.lastRunStatus ? badge(job.lastRunStatus) : job.lastRunAt ? h("span", { class: "muted" }, "in progress") : null,
      job.lastRunAt ? h("div", {}, when(job.lastRunAt, zone)) : job.lastRunStatus ? null : h("span", { class: "muted" }, "—"),
    ),
    h("td", { class: "count num" }, String(job.runCount)),
  );
}

/** Whether a job belongs in the table under the URL's filters (for live insertion only). */
function matches(job, params) {
  const day = (v) => (/^\d{4}-\d\d-\d\d$/.test(v) ? `${v}T00:00:00Z` : v);
  const from = params.get("createdFrom");
  const to = params.get("createdTo");
  return (
    (!from || new Date(job.createdAt) >= new Date(day(from))) &&
    (!to || new Date(job.createdAt) < new Date(day(to))) &&
    (!params.get("status") || job.status === params.get("status")) &&
    (!params.get("lastRunStatus") || job.lastRunStatus === params.get("lastRunStatus")) &&
    (!params.get("task") || job.taskId === params.get("task")) &&
    (!params.get("name") || job.name === params.get("name")) &&
    (!params.get("labels") || selectorMatches(params.get("labels"), job.labels))
  );
}

/** Whether the stored job already shows a run event (the recorder writes it a moment later). */
function reflects(job, event) {
  if (!job || event.kind !== "run") return true;
  if (job.lastExecutionId !== event.executionId) return false;
  return TERMINAL.has(event.status) ? job.lastRunStatus === event.status : job.lastRunAt !== null;
}

export function renderJobs(main, params) {
  const everyone = params.get("allUsers") === "true";
  const tbody = h("tbody", { id: "jobs-body" });
  const status = h("p", { class: "muted", role: "status", id: "jobs-status" }, "Loading…");
  const more = h("nav", { class: "pager", "aria-label": "Pages of jobs" });
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Filter jobs" },
    select("status", "Status", JOB_STATUSES, params.get("status")),
    select("lastRunStatus", "Last run", RUN_STATUSES, params.get("lastRunStatus")),
    h(
      "label",
      {},
      "Task ",
      h("select", { name: "task", id: "filter-task" }, h("option", { value: "" }, "any"),
        params.get("task") ? h("option", { value: params.get("task"), selected: true }, params.get("task")) : null),
    ),
    h("label", {}, "Name ", h("input", { type: "text", name: "name", id: "filter-name", value: params.get("name") ?? "", spellcheck: "false", autocomplete: "off", size: 16 })),
    h(
      "label",
      {},
      "Labels ",
      h("input", {
        type: "text",
        name: "labels",
        id: "filter-labels",
        value: params.get("labels") ?? "",
        placeholder: "team=billing,env!=dev",
        title: "A label selector, Kubernetes syntax: key=value, key!=value, key in (a,b), key notin (a,b), key, !key; commas join them (all must hold)",
        spellcheck: "false",
        autocomplete: "off",
        size: 24,
        "aria-describedby": "filter-labels-error",
      }),
    ),
    h("label", {}, "Created from ", h("input", { type: "date", name: "createdFrom", id: "filter-createdFrom", value: params.get("createdFrom") ?? "" })),
    h("label", {}, "before ", h("input", { type: "date", name: "createdTo", id: "filter-createdTo", value: params.get("createdTo") ?? "" })),
    tokenRole() === "admin"
      ? h("label", {}, h("input", { type: "checkbox", name: "allUsers", id: "filter-allUsers", value: "true", checked: params.get("allUsers") === "true" }), " All users")
      : null,
    h("button", { type: "submit", id: "filter-apply" }, "Apply"),
    h("a", { href: "/ui/", class: "button-link" }, "Clear"),
  );
  // A filter the API refuses (422: a selector that does not parse) is shown here, by its field.
  const filterError = h("p", { class: "error", role: "alert", id: "filter-labels-error" });
  const search = h("input", { type: "search", id: "job-search", name: "job", placeholder: "a job id or idempotency key", size: 34, spellcheck: "false", autocomplete: "off", "aria-describedby": "job-search-result" });
  const found = h("span", { id: "job-search-result", role: "status", class: "muted" });
  const finder = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Find a job by id or idempotency key" },
    h("label", { for: "job-search" }, "Go to job "),
    search,
    h("button", { type: "submit" }, "Go"),
    found,
  );
  finder.addEventListener("submit", async (e) => {
    e.preventDefault();
    const id = search.value.trim();
    if (!id) return;
    // The key first: a list answers 200 when nothing matches, where GET /jobs/<id> is a 404
    // that the browser logs as an error. Only what has a job id's shape is then tried as one.
    const missing = () => {
      const hint = /^[0-9a-f]{1,31}…?$/i.test(id) ? " A job id has 32 hex digits; the table shows its first 12." : "";
      return `No job of yours has the id or idempotency key ${id}.${hint}`;
    };
    try {
      const page = await api(`/jobs?${new URLSearchParams({ idempotencyKey: id, limit: "1" })}`);
      let job = page.items[0];
      if (!job && JOB_ID.test(id)) {
        job = await api(`/jobs/${encodeURIComponent(id.toLowerCase())}`).catch((err) => {
          if (err.status !== 404) throw err;
          return undefined;
        });
      }
      if (!job) {
        found.textContent = missing();
        search.focus();
        return;
      }
      navigate(`/ui/jobs/${encodeURIComponent(job.id)}`);
    } catch (err) {
      found.textContent = err.message;
      search.focus();
    }
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const name of Object.keys(FILTERS)) {
      const el = form.elements[name];
      if (!el) continue;
      const v = el.type === "checkbox" ? (el.checked ? "true" : "") : el.value;
      if (v) q.set(name, v);
    }
    const focused = document.activeElement?.id;
    navigate(`/ui/${q.toString() ? `?${q}` : ""}`);
    if (focused) document.getElementById(focused)?.focus(); // the new view's same control
  });
  // a choice applies at once; typed text on Enter (or Apply), not when focus leaves it
  form.addEventListener("change", (e) => {
    if (e.target.type !== "text") form.requestSubmit();
  });
  main.append(
    h("h1", {}, "Jobs"),
    finder,
    form,
    filterError,
    h(
      "table",
      { class: "grid", id: "jobs" },
      h("caption", { class: "visually-hidden" }, everyone ? "Every user's jobs, newest first" : "Your jobs, newest first"),
      h(
        "thead",
        {},
        h("tr", {}, ["Job", "Labels", "Schedule", "Status", "Next run", "Last run", "Runs"].map((t) => h("th", { scope: "col" }, t))),
      ),
      tbody,
    ),
    status,
    more,
  );

  api("/tasks").then((catalog) => {
    const sel = form.elements.task;
    for (const t of catalog.items) {
      if (t.taskId !== params.get("task")) sel.append(h("option", { value: t.taskId }, t.taskId));
    }
  }).catch(() => {});

  function count() {
    const n = tbody.children.length;
    const filtered = Object.keys(FILTERS).some((k) => k !== "allUsers" && params.get(k));
    status.textContent = n
      ? `${n} job${n === 1 ? "" : "s"} on this page`
      : filtered
        ? "No jobs match these filters."
        : "No jobs yet: create one with POST /jobs or `jobsched submit TASK` (README, \"Using the API\").";
  }

  let stopped = false;
  const firstPage = !params.get("cursor");

  async function load() {
    const page = await api(`/jobs?${apiQuery(params)}`);
    if (stopped) return;
    filterError.textContent = "";
    form.elements.labels.removeAttribute("aria-invalid");
    tbody.replaceChildren(...page.items.map((j) => row(j, everyone)));
    count();
    const links = [];
    if (!firstPage) {
      const q = new URLSearchParams(params);
      q.delete("cursor");
      links.push(h("a", { href: `/ui/${q.toString() ? `?${q}` : ""}` }, "« First page"));
    }
    if (page.nextCursor) {
      const q = new URLSearchParams(params);
      q.set("cursor", page.nextCursor);
      links.push(h("a", { href: `/ui/?${q}`, id: "next-page" }, "Next page »"));
    }
    more.replaceChildren(...links);
  }

  const latest = new Map(); // job id → its latest event
  const refreshers = new Map(); // job id → its refresh, one at a time

  async function refresh(jobId) {
    const event = latest.get(jobId);
    const job = await loadFresh(
      () => api(`/jobs/${encodeURIComponent(jobId)}`).catch((e) => (e.status === 404 ? null : Promise.reject(e))),
      (j) => reflects(j, event),
    );
    if (stopped) return;
    const existing = document.getElementById(`job-${jobId}`);
    if (!job) {
      existing?.remove();
      count();
    } else if (existing) {
      existing.replaceWith(row(job, everyone));
    } else if (firstPage && matches(job, params)) {
      tbody.prepend(row(job, everyone));
      count();
    }
  }

  const feed = new LiveFeed({
    onEvent: (event) => {
      if (event.kind === "job" && event.event === "deleted") {
        document.getElementById(`job-${event.jobId}`)?.remove();
        count();
        return;
      }
      latest.set(event.jobId, event);
      if (!refreshers.has(event.jobId)) refreshers.set(event.jobId, serialized(() => refresh(event.jobId)));
      refreshers.get(event.jobId)();
    },
    onState: liveState,
    onResync: () => show(),
  }).start();

  function show() {
    load().catch((e) => {
      if (stopped) return;
      const fields = e.status === 422 ? (e.errors ?? []).filter((f) => f.field in FILTERS_BY_API) : [];
      if (fields.length) {
        // the API's problem detail, next to the filter it names; the table stays empty
        filterError.textContent = fields.map((f) => `${FILTERS_BY_API[f.field]}: ${f.reason}`).join("; ");
        for (const f of fields) form.elements[FILTERS_BY_API[f.field]]?.setAttribute("aria-invalid", "true");
        tbody.replaceChildren();
        status.textContent = "No jobs shown: fix the filter.";
        return;
      }
      status.textContent = `Cannot load the jobs: ${e.message}`;
      status.classList.add("error");
    });
  }
  show();
  return () => {
    stopped = true;
    feed.stop();
  };
}
