// The dashboard's entry: sign-in, the header, and routing on the path under /ui/.
import { api, ApiError, signIn, signOut, token, tokenRole, tokenUser } from "./api.js";
import { h, tick } from "./format.js";
import { renderCluster } from "./cluster.js";
import { renderJobs } from "./jobs.js";
import { renderJob } from "./job.js";
import { renderOverview } from "./overview.js";
import { renderRun } from "./run.js";
import { navigate } from "./shell.js";
import { renderUpcoming } from "./upcoming.js";

const main = document.getElementById("main");
let cleanup = null;

function signInForm(message) {
  const input = h("input", {
    id: "token",
    name: "token",
    type: "password",
    autocomplete: "off",
    required: true,
    spellcheck: "false",
    "aria-describedby": "token-help",
  });
  const error = h("p", { class: "error", role: "alert", id: "sign-in-error" }, message ?? "");
  const form = h(
    "form",
    { class: "sign-in", "aria-labelledby": "sign-in-title" },
    h("h1", { id: "sign-in-title" }, "Sign in"),
    h("label", { for: "token" }, "Bearer token"),
    input,
    h(
      "p",
      { id: "token-help", class: "muted" },
      "A jobsched API token: ",
      h("code", {}, "jobsched token --user NAME"),
      ", or under ",
      h("code", {}, "jobsched dev"),
      " the one ",
      h("code", {}, "jobsched dev-env --token"),
      " prints. It is kept in this tab only (sessionStorage) and sent as an Authorization header.",
    ),
    h("button", { type: "submit", class: "primary" }, "Sign in"),
    error,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const value = input.value.trim();
    try {
      await api("/jobs?limit=1", { tokenValue: value });
    } catch (err) {
      error.textContent = err instanceof ApiError && err.status === 401
        ? `This token is not accepted (${err.message}). Paste the whole token: three parts separated by dots.`
        : `Cannot check the token: ${err.message}`;
      input.focus();
      return;
    }
    signIn(value);
    route();
  });
  return form;
}

function header() {
  const user = token() ? tokenUser() : null;
  document.getElementById("who").textContent = user ? `signed in as ${user}` : "";
  document.getElementById("sign-out").hidden = !user;
  // Signed out, the pages are not reachable: no links to them.
  document.querySelector(".top nav").hidden = !user;
  document.getElementById("nav-cluster").hidden = !user || tokenRole() !== "admin";
  const here = location.pathname.replace(/^\/ui\/?/, "").split("/")[0] || "jobs";
  for (const a of document.querySelectorAll(".top nav a")) {
    if (a.dataset.page === here) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (!user) document.getElementById("live").hidden = true;
}

function route() {
  if (cleanup) cleanup();
  cleanup = null;
  header();
  main.replaceChildren();
  if (!token()) {
    main.append(signInForm());
    document.getElementById("token").focus();
    return;
  }
  const path = location.pathname.replace(/^\/ui\/?/, "");
  const params = new URLSearchParams(location.search);
  if (params.get("allUsers") === "true" && tokenRole() !== "admin") {
    // Every user's data is an admin's view (the API answers 403): another token sees its own,
    // told why, and the address bar drops the filter so a copied link says what is shown.
    params.delete("allUsers");
    const rest = params.toString();
    history.replaceState(null, "", `${location.pathname}${rest ? `?${rest}` : ""}${location.hash}`);
    main.append(h("p", { class: "muted", role: "status", id: "all-users-note" }, "All users is for admins: this page shows your own."));
  }
  let m;
  if (path === "" || path === "jobs") {
    cleanup = renderJobs(main, params);
  } else if (path === "overview") {
    cleanup = renderOverview(main, params);
  } else if (path === "upcoming") {
    cleanup = renderUpcoming(main, params);
  } else if (path === "cluster") {
    cleanup = renderCluster(main);
  } else if ((m = /^jobs\/([^/]+)$/.exec(path))) {
    cleanup = renderJob(main, decodeURIComponent(m[1]));
  } else if ((m = /^jobs\/([^/]+)\/runs\/([^/]+)$/.exec(path))) {
    cleanup = renderRun(main, decodeURIComponent(m[1]), decodeURIComponent(m[2]));
  } else {
    main.append(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "/ui/" }, "All jobs")));
  }
}

// Same-origin links under /ui/ change the view without a reload.
document.addEventListener("click", (e) => {
  const a = e.target.closest("a[href]");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  const url = new URL(a.href, location.href);
  if (url.origin !== location.origin || !url.pathname.startsWith("/ui/") || url.hash) return;
  e.preventDefault();
  navigate(url.pathname + url.search);
});
window.addEventListener("popstate", route);
window.addEventListener("jobsched:navigate", route);
window.addEventListener("jobsched:signed-out", () => {
  route();
  const error = document.getElementById("sign-in-error");
  if (error) error.textContent = "Signed out: the token is missing, expired or not accepted.";
});
document.getElementById("sign-out").addEventListener("click", () => signOut());
setInterval(tick, 10000);
route();
