// The JSON API and the live feed, with the bearer token kept in sessionStorage (never a URL or
// a cookie). Every request names the token in `Authorization: Bearer`; /ws gets it as its first
// message (browsers cannot set headers on a WebSocket).

const KEY = "jobsched.token";

export function token() {
  return sessionStorage.getItem(KEY);
}

export function signIn(value) {
  sessionStorage.setItem(KEY, value);
}

export function signOut() {
  sessionStorage.removeItem(KEY);
  window.dispatchEvent(new Event("jobsched:signed-out"));
}

/** The token's user (`sub`), decoded for display only: the server verifies the token. */
export function tokenUser(value = token()) {
  try {
    const payload = value.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(payload)).sub ?? null;
  } catch {
    return null;
  }
}

/** The token's role claim ("user" when absent), for display only (the server decides). */
export function tokenRole(value = token()) {
  try {
    const payload = value.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    return JSON.parse(atob(payload)).role ?? "user";
  } catch {
    return "user";
  }
}

/** The token's scopes (null when it has no scope claim: every scope), for display only. */
export function tokenScopes(value = token()) {
  try {
    const payload = value.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const scope = JSON.parse(atob(payload)).scope;
    return typeof scope === "string" ? scope.split(" ").filter(Boolean) : null;
  } catch {
    return null;
  }
}

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.code = problem?.code ?? null;
    this.errors = problem?.errors ?? []; // [{field, reason}] of a 4xx naming fields
  }
}

/** One API call; the parsed JSON answer (null for 204). Raises ApiError with the problem. */
export async function api(path, { method = "GET", body, tokenValue = token() } = {}) {
  const headers = { Accept: "application/json", Authorization: `Bearer ${tokenValue}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit",
    cache: "no-store",
  });
  if (resp.status === 204) return null;
  const data = await resp.json().catch(() => null);
  if (!resp.ok) {
    if (resp.status === 401 && tokenValue === token()) signOut();
    throw new ApiError(resp.status, data);
  }
  return data;
}

/**
 * Live events of the user's jobs (all, or `jobIds`) from GET /ws, resumed without a gap after
 * a disconnect (`lastEventId`). `onEvent(event)` gets each event's body; `onState(state)` one of
 * "connecting", "subscribed", "reconnecting", "unavailable". `onResync()` is called when a
 * subscription starts "from now" (the first one, or a reconnect before any event came): what
 * changed between the page's first load and that moment is in no event, so the page reloads.
 */
export class LiveFeed {
  constructor({ jobIds = null, onEvent, onState = () => {}, onResync = () => {} }) {
    this.jobIds = jobIds;
    this.onEvent = onEvent;
    this.onState = onState;
    this.onResync = onResync;
    this.fromNow = true;
    this.lastEventId = null;
    this.ws = null;
    this.stopped = false;
    this.retries = 0;
    this.timer = null;
  }

  start() {
    this.stopped = false;
    this.connect();
    return this;
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    const ws = this.ws;
    this.ws = null;
    if (!ws) return;
    // Closing a socket that is still connecting makes the browser log an error: close on open.
    if (ws.readyState === WebSocket.CONNECTING) ws.addEventListener("open", () => ws.close(1000));
    else ws.close(1000);
  }

  connect() {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}/ws`);
    this.ws = ws;
    this.onState(this.retries ? "reconnecting" : "connecting");
    ws.addEventListener("open", () => {
      if (this.ws !== ws) return;
      ws.send(JSON.stringify({ type: "auth", token: token() }));
      const sub = { type: "subscribe" };
      if (this.jobIds) sub.jobIds = this.jobIds;
      if (this.lastEventId !== null) sub.lastEventId = this.lastEventId;
      this.fromNow = this.lastEventId === null;
      ws.send(JSON.stringify(sub));
    });
    ws.addEventListener("message", (m) => {
      const msg = JSON.parse(m.data);
      if (msg.type === "subscribed") {
        this.retries = 0;
        this.onState("subscribed");
        if (this.fromNow) this.onResync();
      } else if (msg.type === "event") {
        this.lastEventId = msg.id;
        this.onEvent(msg.event);
      }
    });
    ws.addEventListener("close", (e) => {
      if (this.ws !== ws || this.stopped) return;
      if (e.code === 4001) {
        signOut();
        return;
      }
      if (e.code === 1013 && this.lastEventId === null && this.retries > 2) {
        this.onState("unavailable");
      } else {
        this.onState("reconnecting");
      }
      const delay = Math.min(15000, 500 * 2 ** this.retries);
      this.retries += 1;
      this.timer = setTimeout(() => this.connect(), delay);
    });
  }
}

/** Statuses after which a run changes no more. */
export const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED", "SKIPPED"]);

/**
 * Call `load()` until `isFresh(result)`: for a run event the worker reported, the store has it
 * once the recorder wrote it, a moment after the event. A bounded few tries, then the last
 * answer stands (a newer event brings the next refresh).
 */
export async function loadFresh(load, isFresh, tries = 6) {
  let result = await load();
  for (let i = 0; i < tries && !isFresh(result); i++) {
    await new Promise((resolve) => setTimeout(resolve, 100 * 2 ** i));
    result = await load();
  }
  return result;
}

/**
 * `fn` made to run one at a time: a call while it runs makes it run once more afterwards (calls
 * meanwhile coalesce), so answers are applied in the order they were asked for and the last
 * call's answer is applied last.
 */
export function serialized(fn) {
  let running = null;
  let again = false;
  const run = async () => {
    do {
      again = false;
      try {
        await fn();
      } catch (e) {
        console.warn("refresh", e.message);
      }
    } while (again);
    running = null;
  };
  return () => {
    if (running) again = true;
    else running = run();
    return running;
  };
}
