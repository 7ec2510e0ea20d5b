// The operator console: every figure is read from /admin, every change goes through /admin.
// Elements are built with textContent, never from HTML strings, so answer texts and policy
// contents cannot become markup.

const TOKEN_KEY = "gatewayAdminToken";
const REFRESH_MS = 5000;
const COLORS = ["#2e90fa", "#f79009", "#12b76a", "#9e77ed", "#f04438", "#667085"];
const $ = (id) => document.getElementById(id);
let refresh = null;

function h(tag, attrs = {}, ...children) {
  const svg = ["svg", "polyline", "line", "text", "circle"].includes(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// replaceChildren with arrays of children flattened (it would print an array as text).
function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== ""));
}

class AdminError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function admin(path, options = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const response = await fetch(path, {
    ...options,
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  const body = (response.headers.get("content-type") || "").includes("json") ? await response.json() : await response.text();
  if (response.status === 401) {
    signOut("The admin token was refused.");
    throw new AdminError(401, body);
  }
  if (!response.ok) throw new AdminError(response.status, body);
  return body;
}

// Formatting: a missing figure is a dash, never a zero.
const dash = (v, f) => (v === null || v === undefined ? "–" : f(v));
const pct = (v) => dash(v, (x) => `${(100 * x).toFixed(1)}%`);
const num = (v, digits = 0) => dash(v, (x) => x.toLocaleString("en", { maximumFractionDigits: digits }));
const ms = (v) => dash(v, (x) => `${x.toFixed(1)} ms`);
const joules = (v) => dash(v, (x) => (x >= 1000 ? `${(x / 1000).toFixed(2)} kJ` : `${x.toFixed(2)} J`));
const usd = (v) => dash(v, (x) => `$${x.toPrecision(3)}`);
const when = (ts) => new Date(ts * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";

function table(columns, rows, rowClass = () => null) {
  return h(
    "table",
    {},
    h("thead", {}, h("tr", {}, columns.map(([title]) => h("th", {}, title)))),
    h("tbody", {}, rows.map((row) => h("tr", { class: rowClass(row) }, columns.map(([, cell]) => h("td", {}, cell(row)))))),
  );
}

function confirmThen(text, action) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  $("confirm-yes").onclick = async () => {
    dialog.close();
    await action();
  };
  $("confirm-no").onclick = () => dialog.close();
  dialog.showModal();
}

function lineChart(title, series, unit) {
  const width = 360, height = 140, pad = 28;
  const values = series.flatMap((s) => s.points).filter((v) => v !== null);
  const top = Math.max(...values, 0) || 1;
  const n = Math.max(...series.map((s) => s.points.length), 2);
  const x = (i) => pad + (i * (width - 2 * pad)) / (n - 1);
  const y = (v) => height - pad + 10 - (v / top) * (height - 2 * pad);
  // A line through the buckets that have a figure, and a dot on each (a lone one shows too).
  const lines = series.map((s, k) => [
    h("polyline", {
      points: s.points.map((v, i) => (v === null ? null : `${x(i)},${y(v)}`)).filter(Boolean).join(" "),
      fill: "none",
      stroke: COLORS[k % COLORS.length],
      "stroke-width": 2,
    }),
    s.points.map((v, i) => (v === null ? null : h("circle", { cx: x(i), cy: y(v), r: 2.5, fill: COLORS[k % COLORS.length] }))),
  ]);
  return h(
    "figure",
    {},
    h("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title },
      h("line", { x1: pad, y1: y(0), x2: width - pad, y2: y(0), stroke: "#d0d5dd" }),
      h("text", { x: 2, y: y(top) + 4 }, `${top >= 100 ? top.toFixed(0) : top.toPrecision(2)}${unit}`),
      h("text", { x: 2, y: y(0) }, "0"),
      lines),
    h("figcaption", {}, title, " ", h("span", { class: "legend" },
      series.map((s, k) => h("span", { "data-color": k }, `■ ${s.name}`)))),
  );
}

// --- Fleet ---------------------------------------------------------------------------------

// How long something has lasted, in the largest unit that keeps it readable.
function duration(s) {
  if (s < 120) return `${Math.max(0, s).toFixed(0)} s`;
  if (s < 7200) return `${(s / 60).toFixed(0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

// What a backend's engine says of its prompt cache and generation speed (llama.cpp reports them).
function engineFigures(b) {
  const figures = [];
  if (b.engine_cached_share != null) figures.push(`prompt cache ${pct(b.engine_cached_share)}`);
  if (b.engine_tokens_per_s != null) figures.push(`${num(b.engine_tokens_per_s)} tokens/s`);
  return figures.join(", ");
}

// Parking over the last day: backends on and parked per pool, and each wake-up with its reason.
function parkingSection(parking) {
  if (!parking.pools.length) return [];
  return [
    h("h3", {}, "Parking, the last day"),
    h("div", { class: "charts" }, parking.pools.map((p) => lineChart(
      `${p.pool}: backends on and parked (${p.wakeups} wake-ups, ${joules(p.saved_j)} saved)`,
      [{ name: "on", points: p.daily.map((b) => b.active) }, { name: "parked", points: p.daily.map((b) => b.parked) }],
      "",
    ))),
    parking.wakeups.length
      ? table([["woken at", (w) => w.at], ["backend", (w) => `${w.pool}/${w.backend}`], ["why", (w) => w.reason]], parking.wakeups.slice().reverse())
      : h("p", { class: "muted" }, "No wake-up in the last day."),
  ];
}

const kwh = (v) => dash(v, (x) => (x >= 360000 ? `${(x / 3.6e6).toPrecision(3)} kWh` : joules(x)));
const grams = (v) => dash(v, (x) => (x >= 1000 ? `${(x / 1000).toPrecision(3)} kg` : `${x.toPrecision(3)} g`));
const hours = (v) => dash(v, (x) => `${x.toPrecision(3)} h`);
const change = (v, f) => dash(v, (x) => `${x >= 0 ? "+" : "−"}${f(Math.abs(x))}`);

// The fleet's energy, cost and carbon over the last day, against the day before (the weekly
// report's headline): every device's draw, idle included, and its hours on and parked.
const HEADLINE = [
  ["fleet energy, idle included", "energy_j", kwh],
  ["energy per request", "energy_j_per_request", joules],
  ["fleet cost, device-hours and energy", "cost_usd", usd],
  ["cost per request", "cost_usd_per_request", usd],
  ["fleet carbon", "carbon_g", grams],
  ["device-hours, on and parked", "device_hours", hours],
];

function headlineSection(d) {
  return [
    h("table", { id: "fleet-headline" },
      h("thead", {}, h("tr", {}, ["the last day", "figure", "the day before", "change"].map((t) => h("th", {}, t)))),
      h("tbody", {}, HEADLINE.map(([title, key, f]) => h("tr", {},
        h("td", {}, title), h("td", {}, h("strong", {}, f(d[key]))),
        h("td", {}, f(d.change[key].previous)), h("td", {}, change(d.change[key].change, f)))))),
    h("p", { class: "muted" },
      `Every backend's draw as its meter read it, parked too (${kwh(d.estimated_j)} estimated where none read); `
      + `cost is ${hours(d.device_hours)} of device-hours (${hours(d.parked_hours)} parked) at each pool's hourly price, ${usd(d.hours_usd)}, `
      + `plus the energy at its electricity price, ${usd(d.energy_usd)}; per request over ${num(d.requests)} requests.`),
    d.pools.length
      ? table([
        ["pool", (p) => p.pool],
        ["energy", (p) => kwh(p.energy_j)],
        ["on / parked", (p) => `${hours(p.on_hours)} / ${hours(p.parked_hours)}`],
        ["cost", (p) => usd(p.cost_usd)],
        ["carbon", (p) => grams(p.carbon_g)],
      ], d.pools)
      : null,
  ];
}

async function fleetView(view) {
  const [pools, energy, parking] = await Promise.all([
    admin("/admin/fleet"), admin("/admin/fleet/energy?window=day"), admin("/admin/parking?window=day"),
  ]);
  const rows = pools.flatMap((p) => [{ pool: p }, ...p.backends.map((b) => ({ pool: p, backend: b }))]);
  fill(view, 
    h("h2", {}, "Fleet"),
    ...headlineSection(energy),
    h("h3", {}, "Now"),
    h("p", { class: "muted" }, `Live; refreshed every ${REFRESH_MS / 1000} s. Energy attributed today is requests' share of their backends' draw since 00:00 UTC, a diagnostic: it leaves out backends idle between requests.`),
    table(
      [
        ["pool / backend", (r) => (r.backend ? r.backend.name : r.pool.pool)],
        ["kind", (r) => (r.backend ? "" : `${r.pool.kind}${r.pool.live ? "" : " (shadow-only)"}`)],
        ["health", (r) => (r.backend
          ? (r.backend.healthy ? h("span", { class: "good" }, "healthy") : h("span", { class: "bad" }, `ejected ${num(r.backend.ejected_for_s, 1)} s`))
          : `${r.pool.healthy} / ${r.pool.backends.length} healthy`)],
        ["parking", (r) => (r.backend
          ? (r.backend.parking ? h("span", { title: r.backend.parking.reason }, `${r.backend.parking.state} for ${duration(Date.now() / 1000 - r.backend.parking.since)}`) : "in service")
          : (r.pool.parked ? `${r.pool.parked} of ${r.pool.backends.length} out of service` : ""))],
        ["slots in use", (r) => (r.backend
          ? `${r.backend.in_flight + r.backend.other_replicas + r.backend.external} / ${r.backend.slots}${r.backend.engine_full ? ` (${r.backend.engine_full})` : ""}`
          : `${r.pool.in_use} / ${r.pool.slots}`)],
        ["queued", (r) => (r.backend ? "" : r.pool.queued)],
        ["power now", (r) => dash(r.backend ? r.backend.power_w : r.pool.power_w, (w) => `${w.toFixed(0)} W`)],
        ["energy attributed today", (r) => (r.backend ? "" : joules(r.pool.energy_today_j))],
        ["engine", (r) => (r.backend ? engineFigures(r.backend) : [r.pool.engine, r.pool.engine_version].filter((v) => v).join(" ") || "–")],
        ["driver / firmware", (r) => (r.backend ? "" : [r.pool.driver, r.pool.firmware].map((v) => v || "–").join(" / "))],
        ["model error (e2e, energy)", (r) => (r.backend ? "" : `${pct(r.pool.cost_model_error.e2e)}, ${pct(r.pool.cost_model_error.energy)}`)],
      ],
      rows,
      (r) => (r.backend ? "backend" : "pool"),
    ),
    ...parkingSection(parking),
  );
  return true;
}

// --- Traffic -------------------------------------------------------------------------------

let trafficWindow = "hour";

// What the SLO is judged on (gateway/records/slo.py): the first token of a stream, the whole
// answer of a request not streamed (embeddings included), each shown where the route has some.
const JUDGED = [["TTFT", "ttft"], ["end to end", "e2e"]];

function judgedOn(x) {
  const shown = JUDGED.filter(([, key]) => x[`${key}_p50_ms`] !== null)
    .map(([label, key]) => `${label} ${ms(x[`${key}_p50_ms`])} / ${ms(x[`${key}_p95_ms`])}`);
  return shown.length ? shown.join("; ") : "–";
}

function judgedSeries(r) {
  const present = JUDGED.filter(([, key]) => r[`${key}_p50_ms`] !== null);
  return (present.length ? present : JUDGED.slice(0, 1)).flatMap(([label, key]) => [50, 95].map((q) => (
    { name: `${label} p${q}`, points: r.series.map((b) => b[`${key}_p${q}_ms`]) })));
}

async function trafficView(view) {
  const routes = await admin(`/admin/traffic?window=${trafficWindow}`);
  const picker = h("p", {}, ["hour", "day"].map((w) =>
    h("label", {}, h("input", { type: "radio", name: "window", value: w, checked: w === trafficWindow,
      onchange: () => { trafficWindow = w; show("traffic"); } }), ` last ${w}`)));
  const sections = routes.map((r) => {
    const pools = Object.keys(r.pool_shares);
    return h("section", { class: "route", "data-route": r.route },
      h("h3", {}, r.route),
      table(
        [
          ["requests", (x) => num(x.requests)],
          ["pools", (x) => Object.entries(x.pool_shares).map(([p, s]) => `${p} ${pct(s)}`).join(", ")],
          ["SLO attainment", (x) => pct(x.slo_attainment)],
          ["SLO judged on, p50 / p95", judgedOn],
          ["energy / request", (x) => joules(x.energy_j_per_request)],
          ["cost / request", (x) => usd(x.cost_usd_per_request)],
        ],
        [r],
      ),
      h("div", { class: "charts" },
        lineChart("share served per pool", pools.map((p) => ({ name: p, points: r.series.map((b) => (b.requests ? b.pool_shares[p] || 0 : null)) })), ""),
        lineChart("SLO attainment", [{ name: "attained", points: r.series.map((b) => b.slo_attainment) }], ""),
        lineChart("what the SLO is judged on", judgedSeries(r), " ms"),
        lineChart("energy per request", [{ name: "J", points: r.series.map((b) => b.energy_j_per_request) }], " J"),
        lineChart("cost per request", [{ name: "USD", points: r.series.map((b) => b.cost_usd_per_request) }], " $"),
      ));
  });
  fill(view, h("h2", {}, "Traffic"), picker,
    sections.length ? sections : h("p", { class: "muted" }, `No requests in the last ${trafficWindow}.`));
  return false;
}

// --- Shadow and promotion ------------------------------------------------------------------

async function shadowView(view) {
  const [verdicts, summary, rollouts, shown] = await Promise.all([
    admin("/admin/promotions?evaluate=1"),
    admin("/admin/shadow/summary"),
    admin("/admin/rollouts"),
    shownMeasures(),
  ]);
  const evidence = new Map(summary.map((s) => [`${s.route}/${s.candidate}`, s]));
  const cards = verdicts.map((v) => {
    const s = evidence.get(`${v.route}/${v.candidate}`) || {};
    const pairs = h("div", { class: "pair-list" });
    return h("div", { class: `card ${v.outcome}`, "data-route": v.route, "data-candidate": v.candidate },
      h("h3", {}, `${v.route} → ${v.candidate}: `, h("span", { class: "outcome" }, v.outcome.toUpperCase())),
      h("p", {}, v.reason),
      h("ul", {}, v.checks.map((c) => h("li", {}, h("strong", {}, `${c.name}: ${c.result}. `), c.detail || ""))),
      table(
        [
          ["samples", (x) => num(x.samples)],
          ["dropped", (x) => num(x.dropped)],
          ...shown.map((m) => {
            const form = (v) => (m.rate ? pct(v) : num(v, 4));
            return [`${m.label} (noise floor)`, (x) => `${form(x[m.key])} (${form(x[`noise_${m.key}`])})`];
          }),
          ["p95 latency, primary / candidate", (x) => `${ms(x.primary_latency_p95_ms)} / ${ms(x.candidate_latency_p95_ms)}`],
          ["energy, primary / candidate", (x) => `${joules(x.primary_energy_j)} / ${joules(x.candidate_energy_j)}`],
          ["cost, primary / candidate", (x) => `${usd(x.primary_cost_usd)} / ${usd(x.candidate_cost_usd)}`],
          ["candidate errors", (x) => pct(x.candidate_error_rate)],
        ],
        [s],
      ),
      h("p", {},
        h("button", { onclick: () => showPairs(v.route, v.candidate, pairs) }, "Sampled pairs"), " ",
        h("button", { class: "start-rollout", onclick: () => confirmThen(
          `Start rolling ${v.candidate} out on route ${v.route}: a first step of the route's live traffic goes to ${v.candidate} at once, stepping up as its guards pass, and rolling back by itself if they fail.`,
          () => act(() => admin("/admin/promotions/apply", { method: "POST", body: { route: v.route, candidate: v.candidate } }))) }, "Start rollout")),
      pairs);
  });
  const running = rollouts.filter((r) => r.state === "rolling");
  fill(view, 
    h("h2", {}, "Shadow and promotion"),
    h("h3", {}, "Rollouts"),
    rollouts.length
      ? table(
        [
          ["route", (r) => r.route], ["candidate", (r) => r.candidate], ["state", (r) => r.state],
          ["started", (r) => when(r.started)], ["live traffic to candidate", (r) => pct(r.weight)],
          ["", (r) => (r.state === "rolling" ? h("button", { class: "danger", onclick: () => confirmThen(
            `Roll back ${r.candidate} on ${r.route}: all of the route's live traffic returns to its pools as before the rollout, now.`,
            () => act(() => admin("/admin/promotions/rollback", { method: "POST", body: { route: r.route } }))) }, "Roll back") : "")],
        ],
        rollouts)
      : h("p", { class: "muted" }, "No rollouts."),
    running.length ? h("p", {}, h("button", { onclick: () => confirmThen(
      "Check every running rollout now: a step that is due and whose guards pass moves to its next weight of live traffic; one whose guards fail rolls back.",
      () => act(() => admin("/admin/promotions/advance", { method: "POST" }))) }, "Advance due steps now")) : null,
    h("h3", {}, "Verdicts"),
    cards.length ? cards : h("p", { class: "muted" }, "No shadow evidence yet."),
    h("p", { id: "action-result", class: "muted", role: "status" }),
  );
  return false;
}

async function act(call) {
  try {
    const result = await call();
    await show("shadow");
    $("action-result").textContent = `Done: ${JSON.stringify(result)}`;
  } catch (error) {
    await show("shadow");
    $("action-result").textContent = `Refused: ${error.message}`;
    $("action-result").className = "error";
  }
}

// The measures shown over many pairs, as the gateway declares them (served beside this file).
let shownOnce = null;
function shownMeasures() {
  shownOnce = shownOnce || fetch("measures.json").then((r) => r.json()).catch((error) => {
    shownOnce = null; // asked again on the next refresh
    throw error;
  });
  return shownOnce;
}

function measures(diff) {
  // Every measure the pair has, as the gateway lists them (its one definition of them).
  return Object.entries(diff)
    .filter(([, v]) => v !== null && !(typeof v === "object" && !Object.keys(v).length))
    .map(([k, v]) => `${k} ${typeof v === "number" ? num(v, 4) : typeof v === "object" ? JSON.stringify(v) : v}`)
    .join(" · ");
}

function marked(text, at) {
  // The first differing word marked: the word token at the offset the gateway found.
  if (text === null) return h("span", { class: "muted" }, "(no answer)");
  if (at === null || at === undefined) return text;
  const word = /^(\w+|[^\w\s])/u.exec(text.slice(at));
  const end = at + (word ? word[0].length : 0);
  return [text.slice(0, at), h("mark", {}, text.slice(at, end)), text.slice(end)];
}

async function showPairs(route, candidate, into) {
  const pairs = await admin(`/admin/shadow/pairs?route=${encodeURIComponent(route)}&candidate=${encodeURIComponent(candidate)}&limit=10`);
  fill(into, 
    pairs.length ? "" : h("p", { class: "muted" }, "No sampled pairs with their answers still kept."),
    pairs.map((p) => {
      const [a, b] = p.divergence_offsets || [null, null];
      const d = p.diff;
      return h("div", { class: "pair" },
        h("p", { class: "muted" }, `${when(p.ts)} · ${p.kind} · decision ${p.decision_id} · `,
          d.exact_match ? "identical" : `first differing word ${dash(d.first_divergence, String)}${d.near_tie ? " (a near tie)" : ""}, similarity ${num(d.semantic_similarity, 3)}`),
        h("div", { class: "pairs" },
          h("div", { class: "answer primary" }, h("strong", {}, `${p.primary_pool}: `), marked(p.primary_text, a)),
          h("div", { class: "answer candidate" }, h("strong", {}, `${p.candidate_pool}: `), marked(p.candidate_text, b))),
        h("p", { class: "muted measures" }, measures(d)));
    }),
  );
}

// --- Policy --------------------------------------------------------------------------------

function lineDiff(before, after) {
  // Longest common subsequence of lines; policies are hundreds of lines, so n·m is small.
  const a = before.split("\n"), b = after.split("\n");
  const lcs = Array.from({ length: a.length + 1 }, () => new Array(b.length + 1).fill(0));
  for (let i = a.length - 1; i >= 0; i--)
    for (let j = b.length - 1; j >= 0; j--)
      lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < a.length || j < b.length) {
    if (i < a.length && j < b.length && a[i] === b[j]) { out.push([" ", a[i]]); i++; j++; }
    else if (j < b.length && (i === a.length || lcs[i][j + 1] >= lcs[i + 1][j])) out.push(["+", b[j++]]);
    else out.push(["-", a[i++]]);
  }
  return out;
}

function where(location) {
  const match = /:(\d+):(\d+)$/.exec(location || "");
  return match ? `line ${match[1]}, column ${match[2]}` : location;
}

async function policyView(view) {
  const [active, history] = await Promise.all([admin("/admin/policy"), admin("/admin/policy/versions?limit=20")]);
  const editor = h("textarea", { id: "policy-text", spellcheck: "false", "aria-label": "policy YAML" });
  editor.value = active.yaml;
  const problems = h("div", { id: "policy-problems" });
  const diff = h("div", { id: "policy-diff", class: "diff" });
  const whatIf = h("div", { id: "policy-whatif" });
  const message = h("input", { id: "policy-message", placeholder: "why this change", size: 40 });
  const result = h("p", { id: "policy-result", role: "status" });

  const showDiff = () => {
    const lines = lineDiff(active.yaml, editor.value).filter(([kind], k, all) =>
      kind !== " " || all.slice(Math.max(0, k - 2), k + 3).some(([other]) => other !== " "));
    fill(diff, lines.length ? lines.map(([kind, text]) =>
      h("span", { class: kind === "+" ? "add" : kind === "-" ? "del" : null }, `${kind} ${text}\n`)) : "No change from the active version.");
  };
  const validate = async () => {
    const checked = await admin("/admin/policy/validate", { method: "POST", body: { yaml: editor.value } });
    fill(problems, 
      h("p", { class: checked.valid ? "good" : "bad" }, checked.valid ? "Valid." : "Not valid:"),
      h("ul", { class: "problems" },
        checked.errors.map((e) => h("li", { class: "bad" }, `${where(e.location)}: ${e.path}: ${e.message}`)),
        checked.warnings.map((w) => h("li", { class: "muted" }, `warning, ${where(w.location)}: ${w.path}: ${w.message}`))));
    showDiff();
    return checked.valid;
  };
  const simulate = async () => {
    fill(whatIf, h("p", { class: "muted" }, "Replaying the last 7 days of recorded requests under both policies…"));
    try {
      const run = await admin("/admin/policy/simulate", { method: "POST", body: { yaml: editor.value, days: 7 } });
      if (!run.requests) { fill(whatIf, h("p", { class: "muted" }, "No recorded requests in the last 7 days to replay.")); return; }
      const rows = Object.entries(run.change).filter(([key]) => key !== "pool_shares");
      const shares = run.change.pool_shares;
      fill(whatIf, 
        h("p", {}, `${num(run.requests)} recorded requests replayed.`),
        table([["", ([key]) => key], ["active", ([, v]) => num(v.active, 6)], ["proposed", ([, v]) => num(v.proposed, 6)], ["ratio", ([, v]) => dash(v.ratio, (r) => `×${r}`)]], rows),
        table([["pool", (p) => p], ["share now", (p) => pct(shares.active[p])], ["share proposed", (p) => pct(shares.proposed[p])]],
          [...new Set([...Object.keys(shares.active), ...Object.keys(shares.proposed)])]),
      );
    } catch (error) {
      fill(whatIf, h("p", { class: "error" }, `What-if refused: ${error.message}`));
    }
  };
  const applyPolicy = async () => {
    if (!(await validate())) { result.textContent = "Not applied: fix the errors first."; result.className = "error"; return; }
    if (!message.value.trim()) { result.textContent = "Not applied: say why in the message."; result.className = "error"; return; }
    confirmThen("Apply this policy: it is stored as a new version and serves live traffic on every replica at once.", async () => {
      try {
        const applied = await admin("/admin/policy", { method: "PUT", body: { yaml: editor.value, message: message.value, author: "console" } });
        await show("policy");
        $("policy-result").textContent = applied.changed ? `Applied as version ${applied.version}.` : "Unchanged: this is the active version.";
        $("policy-result").className = "good";
      } catch (error) {
        const listed = error.body && error.body.errors ? error.body.errors.map((e) => `\n${where(e.location)}: ${e.path}: ${e.message}`).join("") : "";
        result.textContent = `Not applied: ${error.message}${listed}`;
        result.className = "error";
      }
    });
  };
  const rollbackTo = (version) => confirmThen(
    `Roll back to version ${version}: its text is stored as a new version and serves live traffic on every replica at once.`,
    async () => {
      try {
        const done = await admin("/admin/policy/rollback", { method: "POST", body: { version, message: `rollback to ${version} from the console`, author: "console" } });
        await show("policy");
        $("policy-result").textContent = `Rolled back: version ${done.version} restores version ${done.restores}.`;
        $("policy-result").className = "good";
      } catch (error) {
        result.textContent = `Not rolled back: ${error.message}`;
        result.className = "error";
      }
    });

  fill(view, 
    h("h2", {}, `Policy (active version ${active.version})`),
    h("div", { class: "editor" },
      h("div", {}, editor),
      h("div", {},
        h("p", {}, h("button", { id: "validate", onclick: validate }, "Validate"), " ",
          h("button", { id: "simulate", onclick: simulate }, "What-if on the last 7 days"), " ",
          message, " ", h("button", { id: "apply", class: "danger", onclick: applyPolicy }, "Apply")),
        result, problems, h("h3", {}, "Diff against the active version"), diff, h("h3", {}, "What-if"), whatIf)),
    h("h3", {}, "History"),
    table(
      [
        ["version", (v) => v.version], ["when", (v) => when(v.created)], ["author", (v) => v.author],
        ["message", (v) => v.message], ["", (v) => (v.version === history.active ? "active"
          : h("button", { class: "rollback", "data-version": v.version, onclick: () => rollbackTo(v.version) }, "Roll back to this"))],
      ],
      history.versions),
  );
  showDiff();
  return false;
}

// --- Reports -------------------------------------------------------------------------------

async function reportsView(view) {
  const reports = await admin("/admin/reports");
  const open = async (week, name) => {
    // Fetched with the token, then shown from memory: a link would carry no header.
    const token = sessionStorage.getItem(TOKEN_KEY);
    const response = await fetch(`/admin/reports/${week}/${name}`, { headers: { Authorization: `Bearer ${token}` } });
    const url = URL.createObjectURL(await response.blob());
    window.open(url, "_blank", "noopener");
  };
  fill(view, 
    h("h2", {}, "Weekly reports"),
    reports.length
      ? table([["week", (r) => r.week], ["files", (r) => (r.files || []).map((f) => h("button", { onclick: () => open(r.week, f) }, f))]], reports)
      : h("p", { class: "muted" }, "No reports kept yet (gateway report weekly, or GATEWAY_REPORT_SCHEDULE)."),
  );
  return false;
}

// --- Navigation and sign-in ----------------------------------------------------------------

const VIEWS = { fleet: fleetView, traffic: trafficView, shadow: shadowView, policy: policyView, reports: reportsView };

async function show(name) {
  clearInterval(refresh);
  for (const tab of document.querySelectorAll("#tabs [data-view]")) tab.classList.toggle("active", tab.dataset.view === name);
  const view = $("view");
  try {
    const live = await VIEWS[name](view);
    if (live) refresh = setInterval(() => VIEWS[name](view).catch(() => {}), REFRESH_MS);
  } catch (error) {
    if (error.status !== 401) fill(view, h("p", { class: "error" }, `Could not load: ${error.message}`));
  }
}

function signOut(why = "") {
  clearInterval(refresh);
  sessionStorage.removeItem(TOKEN_KEY);
  $("tabs").hidden = true;
  $("view").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = why;
}

async function signIn(token) {
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    await admin("/admin/policy");
  } catch (error) {
    if (error.status !== 401) signOut(`The gateway refused: ${error.message}`);
    return;
  }
  $("sign-in").hidden = true;
  $("tabs").hidden = false;
  $("view").hidden = false;
  await show("fleet");
}

$("sign-in-form").addEventListener("submit", (event) => {
  event.preventDefault();
  signIn($("token").value);
  $("token").value = "";
});
$("sign-out").addEventListener("click", () => signOut());
for (const tab of document.querySelectorAll("#tabs [data-view]")) tab.addEventListener("click", () => show(tab.dataset.view));
if (sessionStorage.getItem(TOKEN_KEY)) signIn(sessionStorage.getItem(TOKEN_KEY));
