// Backfill on the Job page: preview (a dry run) or create the runs a cron or interval job
// would have had in a past range (POST /jobs/{id}/backfill, see core/backfill.py).
import { api } from "./api.js";
import { badge, h, inZone } from "./format.js";
import { confirmAction } from "./shell.js";

const POLICIES = ["allow", "forbid", "bufferOne", "replace"];
const SHOWN = 50;

/** A datetime-local value read as UTC, in RFC 3339 ("2026-12-03T05:00" → "…T05:00:00Z"). */
function utc(value) {
  return /^\d{4}-\d\d-\d\dT\d\d:\d\d$/.test(value) ? `${value}:00Z` : `${value}Z`;
}

function resultView(jobId, result) {
  const verb = result.dryRun ? "would be" : "were";
  const counts = `${result.fireTimes.length} fire time${result.fireTimes.length === 1 ? "" : "s"} in the range: ${result.queued} ${verb} queued, ${result.skipped} ${verb} recorded SKIPPED (overlap policy ${result.overlapPolicy}), ${result.existing} had a run already.`;
  if (!result.runs.length) return [h("p", { id: "backfill-counts" }, counts)];
  const runs = result.runs.slice(0, SHOWN);
  return [
    h("p", { id: "backfill-counts" }, result.dryRun ? "Preview (nothing created): " : "Done: ", counts),
    h(
      "table",
      { class: "grid", id: "backfill-runs" },
      h("thead", {}, h("tr", {}, ["Scheduled for (UTC)", "Status", "Created now"].map((t) => h("th", { scope: "col" }, t)))),
      h(
        "tbody",
        {},
        runs.map((r) =>
          h(
            "tr",
            {},
            h("td", { class: "t" }, result.dryRun ? inZone(r.scheduledFor) : h("a", { href: `/ui/jobs/${encodeURIComponent(jobId)}/runs/${encodeURIComponent(r.executionId)}` }, inZone(r.scheduledFor))),
            h("td", {}, badge(r.status)),
            h("td", {}, r.created ? "yes" : "no"),
          ),
        ),
      ),
    ),
    result.runs.length > SHOWN ? h("p", { class: "muted" }, `… and ${result.runs.length - SHOWN} more.`) : null,
  ];
}

/**
 * The Backfill section: `getJob()` is the job as last loaded, `onDone()` refreshes the page
 * after runs were created.
 */
export function backfillSection(base, getJob, onDone) {
  const from = h("input", { type: "datetime-local", id: "backfill-from", name: "from", required: true });
  const to = h("input", { type: "datetime-local", id: "backfill-to", name: "to", required: true });
  const policy = h("select", { id: "backfill-policy", name: "overlapPolicy" }, h("option", { value: "" }, "the job's"), POLICIES.map((p) => h("option", { value: p }, p)));
  const error = h("p", { class: "error", role: "alert", id: "backfill-error" });
  const out = h("div", { id: "backfill-result", role: "status", "aria-live": "polite" });
  const form = h(
    "form",
    { class: "filters", id: "backfill-form", "aria-labelledby": "backfill-title" },
    h("label", { for: "backfill-from" }, "From (UTC) "),
    from,
    h("label", { for: "backfill-to" }, "to, before (UTC) "),
    to,
    h("label", { for: "backfill-policy" }, "Overlap policy "),
    policy,
    h("button", { type: "submit", id: "backfill-preview" }, "Preview"),
    h("button", { type: "button", id: "backfill-run", onclick: () => send(false) }, "Create runs"),
  );

  async function send(dryRun) {
    if (!form.reportValidity()) return;
    const body = { from: utc(from.value), to: utc(to.value), dryRun };
    if (policy.value) body.overlapPolicy = policy.value;
    if (!dryRun) {
      const job = getJob();
      const ok = await confirmAction(`Backfill: ${job.name ?? job.taskId}`, `The runs of its occurrences from ${body.from} to before ${body.to} that have none yet are created and run now.`, "Create runs");
      if (!ok) return;
    }
    error.textContent = "";
    try {
      const result = await api(`${base}/backfill`, { method: "POST", body });
      out.replaceChildren(...resultView(getJob().id, result).filter(Boolean));
      if (!dryRun) onDone();
    } catch (e) {
      const fields = (e.errors ?? []).map((f) => `${f.field}: ${f.reason}`).join("; ");
      error.textContent = `Backfill: ${fields || e.message}`;
      out.replaceChildren();
    }
  }
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    send(true);
  });
  return h(
    "section",
    { "aria-labelledby": "backfill-title", id: "backfill" },
    h("h2", { id: "backfill-title" }, "Backfill"),
    h("p", { class: "muted" }, "The runs this job would have had between two past instants (UTC). Preview lists them and creates nothing."),
    form,
    error,
    out,
  );
}
