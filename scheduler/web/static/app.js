// Shoal's web view: renders the scheduler's document (GET /state, then server-sent events on
// /events). Everything shown is set with textContent or setAttribute: no markup from data.
"use strict";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

// Twelve well-separated colours, then golden-angle hues; each gang keeps the colour it got
// when the page first saw it.
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2",
  "#edc948", "#9c755f", "#ff9da7", "#2f4b7c", "#a05195", "#665191"];
const colours = new Map();

function colour(key) {
  if (!colours.has(key)) {
    const n = colours.size;
    colours.set(key, n < PALETTE.length
      ? PALETTE[n]
      : "hsl(" + Math.round(n * 137.508) % 360 + ", 60%, 50%)");
  }
  return colours.get(key);
}

function assignColours(doc) {
  // In the order the gangs are listed, so that the first gangs get the clearest colours.
  for (const gang of doc.gangs) colour(gang.key);
}

function time(seconds) {
  return new Date(seconds * 1000).toISOString().slice(11, 19);
}

function renderNode(node, leaving) {
  const box = el("div", "node");
  box.setAttribute("data-node", node.name);
  if (node.capacityType === "spot") box.classList.add("spot");
  if (node.revoking) box.classList.add("revoking");
  const head = el("div");
  head.appendChild(el("span", "node-name", node.name));
  if (node.capacityType === "spot") head.appendChild(el("span", "badge spot", "spot"));
  if (node.revoking) {
    const badge = el("span", "badge revoking", "revoking");
    badge.title = node.revoking;
    head.appendChild(badge);
  }
  if (node.unschedulable) head.appendChild(el("span", "badge cordoned", "cordoned"));
  box.appendChild(head);
  const info = [node.gpusFree + "/" + node.gpus + " GPUs free"];
  if (node.zone) info.push(node.zone);
  box.appendChild(el("div", "node-info", info.join(" · ")));
  const islands = el("div", "islands");
  for (const island of node.islands) {
    const group = el("div", "island");
    group.setAttribute("data-island", island.id);
    group.title = "NVLink island " + island.id;
    for (const gpu of island.gpus) {
      const cell = el("span", "cell");
      cell.setAttribute("data-gpu", gpu.index);
      if (gpu.health !== "healthy") cell.classList.add("failed");
      if (gpu.pod) {
        cell.setAttribute("data-pod", gpu.pod);
        if (gpu.gang) {
          cell.setAttribute("data-gang", gpu.gang);
          cell.style.backgroundColor = colour(gpu.gang);
        } else {
          cell.classList.add("other");
        }
        if (leaving.has(gpu.pod)) cell.classList.add("leaving");
        cell.title = "GPU " + gpu.index + ": " + gpu.pod + (gpu.gang ? " (" + gpu.gang + ")" : "");
      } else {
        cell.classList.add("free");
        cell.title = "GPU " + gpu.index + ": " + (gpu.health === "healthy" ? "free" : gpu.health);
      }
      group.appendChild(cell);
    }
    islands.appendChild(group);
  }
  box.appendChild(islands);
  return box;
}

function renderCluster(doc) {
  const racks = new Map();
  for (const node of doc.nodes) {
    const rack = node.rack || "";
    if (!racks.has(rack)) racks.set(rack, []);
    racks.get(rack).push(node);
  }
  const root = document.getElementById("cluster");
  const fresh = [];
  for (const [rack, nodes] of racks) {
    const box = el("div", "rack");
    box.setAttribute("data-rack", rack);
    box.appendChild(el("div", "rack-name", rack ? "rack " + rack : "no rack"));
    const list = el("div", "nodes");
    for (const node of nodes) {
      const leaving = new Set(node.pods.filter((p) => p.leaving).map((p) => p.key));
      list.appendChild(renderNode(node, leaving));
    }
    box.appendChild(list);
    fresh.push(box);
  }
  root.replaceChildren(...fresh);
}

function renderGangs(doc) {
  const rows = [];
  for (const gang of doc.gangs) {
    const row = el("tr");
    row.setAttribute("data-gang", gang.key);
    row.appendChild(el("td", "queue", gang.queue === null ? "" : gang.queue));
    const name = el("td", "name");
    const swatch = el("span", "swatch");
    swatch.style.backgroundColor = colour(gang.key);
    name.appendChild(swatch);
    name.appendChild(el("span", null, gang.key));
    row.appendChild(name);
    row.appendChild(el("td", "phase", gang.phase));
    row.appendChild(el("td", "bound", gang.bound));
    row.appendChild(el("td", "min", gang.min));
    row.appendChild(el("td", "max", gang.max));
    row.appendChild(el("td", "pending", gang.pending));
    row.appendChild(el("td", "priority", gang.priority));
    // What `kubectl shoal why` prints: its bounds and what it waits for.
    row.appendChild(el("td", "why", gang.why || ""));
    const changes = el("td", "bounds");
    const list = el("ul");
    for (const change of gang.boundChanges || []) list.appendChild(el("li", null, change.text));
    changes.appendChild(list);
    row.appendChild(changes);
    rows.push(row);
  }
  document.querySelector("#gangs tbody").replaceChildren(...rows);
  const bad = [];
  for (const gang of doc.invalid) {
    const row = el("tr");
    row.setAttribute("data-gang", gang.key);
    row.appendChild(el("td", "name", gang.key));
    row.appendChild(el("td", "reason", gang.reason));
    row.appendChild(el("td", "message", gang.message));
    bad.push(row);
  }
  document.querySelector("#invalid tbody").replaceChildren(...bad);
}

function renderTimeline(doc) {
  const items = [];
  for (const entry of doc.timeline.slice().reverse()) {
    const item = el("li");
    item.setAttribute("data-kind", entry.kind);
    item.appendChild(el("span", "at", time(entry.at) + " "));
    item.appendChild(el("span", "kind kind-" + entry.kind, entry.kind));
    item.appendChild(el("span", "text", " " + entry.text));
    items.push(item);
  }
  document.getElementById("timeline").replaceChildren(...items);
}

function render(doc) {
  if (!doc) return;
  document.getElementById("scheduler").textContent = doc.scheduler;
  document.getElementById("updated").textContent = "as of " + time(doc.now) + " UTC";
  assignColours(doc);
  renderCluster(doc);
  renderGangs(doc);
  renderTimeline(doc);
  document.body.setAttribute("data-rendered", String(doc.now));
}

function status(state) {
  const node = document.getElementById("status");
  node.setAttribute("data-state", state);
  node.textContent = state;
}

function start() {
  fetch("/state").then((r) => r.json()).then(render).catch(() => status("lost"));
  const events = new EventSource("/events");
  events.addEventListener("open", () => status("live"));
  events.addEventListener("error", () => status("lost"));
  events.addEventListener("state", (event) => {
    status("live");
    render(JSON.parse(event.data));
  });
}

start();
