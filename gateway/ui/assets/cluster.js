// Cluster (admins): schedulers and the partitions they lease (with each lease's expiry),
// queues and their depth, every live worker (its heartbeat) and the runs in flight — GET
// /cluster, one request. A token that is not an admin's makes no request: the page says so.
import { api, LiveFeed, tokenRole, tokenScopes } from "./api.js";
import { hbars } from "./charts.js";
import { h, inZone, relative, shortId, when } from "./format.js";
import { liveState } from "./shell.js";

const HEARTBEAT_MS = 5000; // core.cluster.PRESENCE_HEARTBEAT_SECONDS

/** Whether the token's claims allow GET /cluster: role admin and, when scoped, jobs:read. */
function mayReadCluster() {
  const scopes = tokenScopes();
  return tokenRole() === "admin" && (scopes === null || scopes.includes("jobs:read"));
}

function schedulers(bus) {
  if (!bus.members.length) return h("p", { class: "muted", id: "schedulers" }, "No scheduler holds a lease or sends a heartbeat.");
  const leases = new Map(bus.leases.map((l) => [l.partition, l]));
  return h(
    "div",
    { class: "cards", id: "schedulers" },
    bus.members.map((m) =>
      h(
        "section",
        { class: "card", dataset: { scheduler: m.scheduler }, "aria-label": `Scheduler ${m.scheduler}` },
        h("h3", { class: "mono" }, m.scheduler),
        h("p", { class: "muted" }, m.heartbeatAt ? ["heartbeat ", when(m.heartbeatAt)] : "no heartbeat key (its leases only)"),
        h("p", {}, `${m.partitions.length} of ${bus.partitions} partitions`),
        h(
          "ul",
          { class: "partitions", "aria-label": "Leased partitions" },
          m.partitions.map((p) => {
            const l = leases.get(p);
            const expires = l?.expiresAt ? `expires ${inZone(l.expiresAt)} (${relative(l.expiresAt)}), revision ${l.revision}` : "";
            return h("li", { title: `partition ${p}: ${expires}`, dataset: { partition: String(p) } }, String(p));
          }),
        ),
      ),
    ),
  );
}

function leaseTable(bus) {
  return h(
    "table",
    { class: "grid", id: "leases" },
    h("caption", { class: "visually-hidden" }, "Partition leases"),
    h("thead", {}, h("tr", {}, ["Partition", "Scheduler", "Renewed", "Expires unless renewed", "Revision"].map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      {},
      bus.leases.map((l) =>
        h("tr", { dataset: { partition: String(l.partition) } },
          h("td", { class: "num" }, String(l.partition)),
          h("td", { class: "mono" }, l.owner),
          h("td", {}, when(l.renewedAt)),
          h("td", { class: "expires" }, when(l.expiresAt)),
          h("td", { class: "num" }, String(l.revision))),
      ),
    ),
  );
}

function queues(bus) {
  if (!bus.queues.length) return h("p", { class: "muted" }, "No queue configured.");
  return [
    hbars({
      id: "cluster-queues-chart",
      name: "Work queue depth",
      rows: bus.queues.map((q) => ({
        label: q.queue,
        parts: [
          { value: q.pending, cls: "bar-queued", title: `${q.queue}: ${q.pending} waiting for a worker` },
          { value: q.inFlight, cls: "bar-running", title: `${q.queue}: ${q.inFlight} delivered, not yet acknowledged` },
        ],
      })),
    }),
    // What the bars measure (a queue with none shows 0 and no bar).
    h("ul", { class: "legend", id: "cluster-queues-legend" },
      h("li", {}, h("span", { class: "swatch bar-queued" }), "waiting for a worker"),
      h("li", {}, h("span", { class: "swatch bar-running" }), "in flight (delivered, not yet acknowledged)")),
    h(
      "table",
      { class: "grid", id: "cluster-queues" },
      h("thead", {}, h("tr", {}, ["Queue", "Waiting", "In flight", "Idle worker fetches"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, bus.queues.map((q) => h("tr", { dataset: { queue: q.queue } },
        h("td", {}, q.queue, q.exists ? null : h("span", { class: "muted" }, " (no worker has consumed it yet)")),
        h("td", { class: "num pending" }, String(q.pending)),
        h("td", { class: "num" }, String(q.inFlight)),
        h("td", { class: "num" }, String(q.waitingPulls))))),
    ),
  ];
}

function liveness(w) {
  const p = w.presence;
  if (!p) return h("span", { class: "error" }, "no heartbeat (known by its runs only)");
  return h("span", { title: `expires ${inZone(p.expiresAt)} unless renewed` }, "heartbeat ", when(p.heartbeatAt));
}

function workers(view) {
  if (!view.workers.length) return h("p", { class: "muted", id: "workers" }, "No worker sends a heartbeat or has a run in flight.");
  return h(
    "table",
    { class: "grid", id: "workers" },
    h("caption", { class: "visually-hidden" }, "Workers"),
    h("thead", {}, h("tr", {}, ["Worker", "Queues", "In flight", "Version", "Started", "Alive"].map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      {},
      view.workers.map((w) => {
        const hb = w.presence?.heartbeat;
        return h("tr", { dataset: { worker: w.workerId }, class: w.presence ? "" : "gone" },
          h("td", { class: "mono" }, w.workerId),
          h("td", {}, hb ? hb.queues.join(", ") : "—"),
          h("td", { class: "num in-flight" }, hb ? `${hb.inFlight} of ${hb.concurrency}` : String(w.runs.length)),
          h("td", {}, hb ? hb.version : "—"),
          h("td", {}, hb ? when(hb.startedAt) : "—"),
          h("td", {}, liveness(w)));
      }),
    ),
  );
}

function inFlightRuns(view) {
  const rows = view.workers.flatMap((w) => w.runs.map((r) => [w, r]));
  if (!rows.length) return h("p", { class: "muted", id: "in-flight" }, "No run is running now.");
  return h(
    "table",
    { class: "grid", id: "in-flight" },
    h("caption", { class: "visually-hidden" }, "Runs in flight"),
    h("thead", {}, h("tr", {}, ["Worker", "Run", "Task", "Owner", "Queue", "Attempt", "Started"].map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      {},
      rows.map(([w, r]) =>
        h("tr", { dataset: { worker: w.workerId } },
          h("td", { class: "mono" }, w.workerId),
          h("td", {}, h("a", { class: "mono", href: `/ui/jobs/${encodeURIComponent(r.jobId)}/runs/${encodeURIComponent(r.executionId)}` }, shortId(r.executionId))),
          h("td", {}, r.taskId),
          h("td", {}, r.owner),
          h("td", {}, r.queue),
          h("td", { class: "num" }, String(r.attempt)),
          h("td", {}, when(r.startedAt))),
      ),
    ),
  );
}

export function renderCluster(main) {
  if (!mayReadCluster()) {
    // Decided before any request: a non-admin's page makes none (the server decides anyway).
    main.append(h("h1", {}, "Cluster"), h("p", { class: "error", role: "status", id: "cluster-status" }, "Admins only: your token's role may not see the cluster."));
    return () => {};
  }
  const status = h("p", { class: "muted", role: "status", id: "cluster-status" }, "Loading…");
  const body = h("div", { id: "cluster" });
  const refresh = h("button", { type: "button", id: "cluster-refresh" }, "Refresh");
  main.append(h("h1", {}, "Cluster"), h("div", { class: "controls" }, refresh), status, body);
  let stopped = false;
  let timer = null;

  async function load() {
    timer = null;
    try {
      const view = await api("/cluster");
      if (stopped) return;
      const bus = view.bus;
      status.textContent = `As of ${inZone(view.at)}.${view.truncated ? " More runs are in flight than shown." : ""}`;
      status.classList.remove("error");
      body.replaceChildren(
        ...(bus
          ? [
              h("h2", {}, `Schedulers (lease TTL ${bus.leaseTtlSeconds} s)`),
              schedulers(bus),
              view.unleased.length ? h("p", { class: "error", id: "unleased" }, `Unleased partitions: ${view.unleased.join(", ")}`) : h("p", { class: "muted", id: "unleased" }, "Every partition is leased."),
              h("details", {}, h("summary", {}, `All ${bus.leases.length} leases`), leaseTable(bus)),
              h("h2", {}, "Queues"),
              ...queues(bus),
            ]
          : [h("p", { class: "muted" }, "This gateway runs without NATS: no leases or queues to show.")]),
        h("h2", {}, "Workers"),
        workers(view),
        h("h2", {}, "Runs in flight"),
        inFlightRuns(view),
      );
    } catch (e) {
      status.textContent = e.status === 403 ? "Only an admin may see the cluster." : `Cannot load the cluster: ${e.message}`;
      status.classList.add("error");
    }
  }
  refresh.addEventListener("click", load);
  // A run starting or ending changes the workers and queues: reload, at most once per 2 s.
  const soon = () => {
    if (!timer && !stopped) timer = setTimeout(load, 2000);
  };
  const feed = new LiveFeed({ onEvent: (e) => e.kind === "run" && soon(), onState: liveState, onResync: soon }).start();
  // Workers come, go and renew their heartbeat (every 5 s) without any event on the feed:
  // reload as often as they renew, while the tab is visible.
  const beat = setInterval(() => document.visibilityState === "visible" && load(), HEARTBEAT_MS);
  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
    clearInterval(beat);
    feed.stop();
  };
}
