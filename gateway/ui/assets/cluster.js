// Cluster (admins): schedulers and their partition leases, workers and their runs, queues.
import { api } from "./api.js";
import { h } from "./format.js";

export function renderCluster(main) {
  const status = h("p", { class: "muted", role: "status", id: "cluster-status" }, "Loading…");
  main.append(h("h1", {}, "Cluster"), status);
  api("/cluster").catch((e) => {
    status.textContent = e.status === 403 ? "Only an admin may see the cluster." : `Cannot load the cluster: ${e.message}`;
    status.classList.add("error");
  });
  return () => {};
}
