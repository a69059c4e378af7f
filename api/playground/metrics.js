// The server panel: /metrics polled every few seconds (Prometheus text), turned into per-interval
// figures and drawn as small line charts on canvases, over the last five minutes.

const POLL_MS = 2000;
const WINDOW_MS = 5 * 60 * 1000;

// Each chart: a title, a unit, and its value for one interval from two scrapes (a, b), or null
// where the interval saw nothing to measure.
const CHARTS = [
  ["ttft", "Time to first token", "ms",
    (a, b) => ratio(a, b, "corral_time_to_first_token_seconds_sum", "corral_time_to_first_token_seconds_count", 1000)],
  ["itl", "Inter-token latency", "ms",
    (a, b) => ratio(a, b, "corral_inter_token_latency_seconds_sum", "corral_inter_token_latency_seconds_count", 1000)],
  ["throughput", "Throughput", "tok/s",
    (a, b) => delta(a, b, "corral_completion_tokens_total") / ((b.at - a.at) / 1000)],
  ["radix", "Radix cache hit rate", "%",
    (a, b) => ratio(a, b, "corral_radix_cache_hit_tokens_total", "corral_prompt_tokens_total", 100)],
  ["compile", "Compile time (mean)", "ms",
    (a, b) => ratio(a, b, "corral_constraint_compile_seconds_total", "corral_constraint_compile_count_total", 1000)],
  ["queue", "Queue depth", "requests", (a, b) => b.values.get("corral_queue_depth") ?? null],
];

export function parseMetrics(text) {
  const values = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const v = Number(m[3]);
    if (Number.isFinite(v)) values.set(m[1], (values.get(m[1]) || 0) + v); // summed over labels
  }
  return values;
}

function delta(a, b, name) {
  return (b.values.get(name) || 0) - (a.values.get(name) || 0);
}

function ratio(a, b, num, den, scale) {
  const d = delta(a, b, den);
  return d > 0 ? (delta(a, b, num) / d) * scale : null;
}

export class ServerPanel {
  constructor(api, parent) {
    this.api = api;
    this.last = null;
    this.series = new Map(CHARTS.map(([id]) => [id, []]));
    this.charts = new Map();
    for (const [id, title, unit] of CHARTS) {
      const box = document.createElement("figure");
      box.className = "chart";
      box.id = `chart-${id}`;
      const head = document.createElement("header");
      const name = document.createElement("span");
      name.textContent = `${title} (${unit})`;
      const now = document.createElement("b");
      now.textContent = "—";
      head.append(name, now);
      const canvas = document.createElement("canvas");
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", `${title} over the last five minutes`);
      box.append(head, canvas);
      parent.append(box);
      this.charts.set(id, { box, now, canvas, unit });
    }
    addEventListener("resize", () => this.drawAll());
  }

  start() {
    const tick = async () => {
      if (!document.hidden) await this.poll().catch(() => {});
      this.timer = setTimeout(tick, POLL_MS);
    };
    tick();
  }

  async poll() {
    const scrape = { at: Date.now(), values: parseMetrics(await this.api.text("/metrics")) };
    if (this.last) {
      for (const [id, , , value] of CHARTS) {
        const v = value(this.last, scrape);
        const points = this.series.get(id);
        points.push([scrape.at, v === null || !Number.isFinite(v) ? null : v]);
        while (points.length && points[0][0] < scrape.at - WINDOW_MS) points.shift();
      }
    }
    this.last = scrape;
    this.drawAll();
  }

  drawAll() {
    for (const [id, chart] of this.charts) draw(chart, this.series.get(id));
  }
}

function draw(chart, points) {
  const { canvas, now, box } = chart;
  const ratio = devicePixelRatio || 1;
  const w = canvas.clientWidth, h = canvas.clientHeight;
  if (!w || !h) return;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, w, h);
  const known = points.filter(([, v]) => v !== null);
  box.dataset.points = String(known.length);
  const latest = known.length ? known[known.length - 1][1] : null;
  now.textContent = latest === null ? "—" : fmt(latest);
  const end = Date.now(), start = end - WINDOW_MS;
  const top = Math.max(1e-9, ...known.map(([, v]) => v)) * 1.15;
  const x = (t) => ((t - start) / WINDOW_MS) * (w - 2) + 1;
  const y = (v) => h - 14 - (v / top) * (h - 20);
  g.strokeStyle = "#d8dce3";
  g.beginPath(); g.moveTo(0, h - 13.5); g.lineTo(w, h - 13.5); g.stroke();
  g.fillStyle = "#5d6677";
  g.font = "10px system-ui, sans-serif";
  g.fillText(`max ${fmt(top / 1.15)}`, 2, 10);
  g.fillText("−5 min", 2, h - 2);
  g.fillText("now", w - 20, h - 2);
  g.strokeStyle = "#2456c7";
  g.fillStyle = "#2456c7";
  g.lineWidth = 1.5;
  g.beginPath();
  let open = false;
  for (const [t, v] of points) {
    if (v === null) { open = false; continue; }
    if (open) g.lineTo(x(t), y(v)); else g.moveTo(x(t), y(v));
    open = true;
  }
  g.stroke();
  for (const [t, v] of known) { g.beginPath(); g.arc(x(t), y(v), 2, 0, 2 * Math.PI); g.fill(); }
}

function fmt(v) {
  return v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}
