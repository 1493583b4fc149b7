// What every page shares: navigation, the live indicator, the confirm dialog.

/** Go to a dashboard URL without reloading the page (links call it too). */
export function navigate(url, { replace = false } = {}) {
  if (replace) history.replaceState(null, "", url);
  else history.pushState(null, "", url);
  window.dispatchEvent(new Event("jobsched:navigate"));
}

/** Show the state of the live feed in the header ("live", "reconnecting…"). */
export function liveState(state) {
  const el = document.getElementById("live");
  el.hidden = false;
  el.dataset.state = state;
  el.textContent = { subscribed: "● live", connecting: "connecting…", reconnecting: "reconnecting…", unavailable: "live status unavailable" }[state] ?? state;
  document.body.dataset.live = state;
}

/** Ask the user to confirm an action in a modal dialog; resolves true for OK. */
export function confirmAction(title, text, okLabel) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  const ok = document.getElementById("confirm-ok");
  const back = document.getElementById("confirm-back");
  ok.textContent = okLabel;
  return new Promise((resolve) => {
    const done = (answer) => {
      ok.removeEventListener("click", onOk);
      back.removeEventListener("click", onBack);
      dialog.removeEventListener("cancel", onBack);
      dialog.close();
      resolve(answer);
    };
    const onOk = () => done(true);
    const onBack = () => done(false);
    ok.addEventListener("click", onOk);
    back.addEventListener("click", onBack);
    dialog.addEventListener("cancel", onBack);
    dialog.showModal();
    back.focus();
  });
}

