// Labels: chips, and a label-selector matcher for live rows (Kubernetes grammar, as
// core/labels.py). The server validates and applies every selector; this only decides whether a
// job that an event brought belongs in a table the server already filtered with it.
import { h } from "./format.js";

/** Compact chips "key=value" of a job's labels, each a link to the jobs with that label. */
export function labelChips(labels, { link = true } = {}) {
  const entries = Object.entries(labels ?? {}).sort(([a], [b]) => a.localeCompare(b));
  if (!entries.length) return null;
  return h(
    "ul",
    { class: "chips", "aria-label": "Labels" },
    entries.map(([k, v]) => {
      const text = v === "" ? k : `${k}=${v}`;
      const selector = `${k}=${v}`;
      return h(
        "li",
        { class: "chip" },
        link ? h("a", { href: `/ui/?${new URLSearchParams({ labels: selector })}`, title: `Jobs labelled ${text}` }, text) : text,
      );
    }),
  );
}

function splitRequirements(text) {
  const parts = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    if (text[i] === "(") depth++;
    else if (text[i] === ")") depth--;
    else if (text[i] === "," && depth === 0) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  parts.push(text.slice(start));
  return parts.map((p) => p.trim()).filter(Boolean);
}

const SET = /^([^\s,()=!]+)\s+(in|notin)\s*\(([^()]*)\)$/;
const EQUALITY = /^([^\s,()=!]+)\s*(==|=|!=)\s*([^\s,()=!]*)$/;
const EXISTS = /^(!?)\s*([^\s,()=!]+)$/;

/** Whether `labels` (an object) satisfies `selector` (text); an unparsable part matches none. */
export function selectorMatches(selector, labels = {}) {
  const has = (k) => Object.prototype.hasOwnProperty.call(labels, k);
  return splitRequirements(selector ?? "").every((req) => {
    let m;
    if ((m = SET.exec(req))) {
      const values = m[3].split(",").map((v) => v.trim());
      const inSet = has(m[1]) && values.includes(labels[m[1]]);
      return m[2] === "in" ? inSet : !inSet;
    }
    if ((m = EQUALITY.exec(req))) {
      const equal = has(m[1]) && labels[m[1]] === m[3];
      return m[2] === "!=" ? !equal : equal;
    }
    if ((m = EXISTS.exec(req))) return m[1] ? !has(m[2]) : has(m[2]);
    return false;
  });
}
