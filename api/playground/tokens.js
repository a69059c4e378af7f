// The token view of one choice: each token coloured by how it was produced (the `provenance`
// extension of logprobs.content[]), its details (logprob, alternatives, how many tokens the
// mask allowed) on hover, click or arrow keys.

const SOURCES = ["sampled", "forced", "closed"];
const SOURCE_TEXT = {
  sampled: "sampled from the model",
  forced: "forced by the grammar (jump-forward)",
  closed: "closed by the budget",
};

export class TokenView {
  constructor(parent) {
    this.entries = [];
    this.selected = -1;
    this.legend = el("div", "legend");
    this.box = el("div", "tokens");
    this.box.tabIndex = 0;
    this.box.setAttribute("role", "listbox");
    this.box.setAttribute("aria-label", "Output tokens: arrow keys move between tokens");
    this.detail = el("div", "detail");
    this.detail.setAttribute("aria-live", "polite");
    this.detail.textContent = "Hover a token (or focus here and use the arrow keys) for its details.";
    parent.append(this.legend, this.box, this.detail);
    this.box.addEventListener("keydown", (e) => this.key(e));
    this.box.addEventListener("focus", () => { if (this.selected < 0 && this.entries.length) this.select(0); });
    this.renderLegend();
  }

  add(entries) {
    for (const entry of entries) {
      const i = this.entries.length;
      this.entries.push(entry);
      const span = el("span", `tok ${entry.provenance || "sampled"}`);
      span.textContent = entry.token;
      span.dataset.i = String(i);
      span.setAttribute("role", "option");
      span.addEventListener("mouseenter", () => this.select(i));
      span.addEventListener("click", () => this.select(i));
      this.box.append(span);
    }
    this.renderLegend();
  }

  counts() {
    const c = { sampled: 0, forced: 0, closed: 0 };
    for (const e of this.entries) c[e.provenance || "sampled"]++;
    return c;
  }

  renderLegend() {
    const c = this.counts();
    this.legend.replaceChildren(...SOURCES.map((s) => {
      const span = el("span", s);
      span.textContent = `${s}: ${c[s]}`;
      span.dataset.count = String(c[s]);
      return span;
    }));
  }

  key(e) {
    const moves = { ArrowRight: 1, ArrowDown: 1, ArrowLeft: -1, ArrowUp: -1, Home: -1e9, End: 1e9 };
    if (!(e.key in moves) || !this.entries.length) return;
    e.preventDefault();
    this.select(Math.max(0, Math.min(this.entries.length - 1, this.selected + moves[e.key])));
  }

  select(i) {
    this.box.querySelector(".tok.sel")?.classList.remove("sel");
    const span = this.box.children[i];
    if (!span) return;
    span.classList.add("sel");
    span.scrollIntoView({ block: "nearest" });
    this.selected = i;
    const e = this.entries[i];
    const head = el("div");
    const p = Math.exp(e.logprob);
    const allowed = e.allowed_tokens === undefined
      ? "no mask: appended without a draw"
      : `${e.allowed_tokens.toLocaleString()} token${e.allowed_tokens === 1 ? "" : "s"} allowed by the mask`;
    head.textContent = `#${i + 1} ${JSON.stringify(e.token)} · ${SOURCE_TEXT[e.provenance || "sampled"]}`
      + ` · logprob ${e.logprob.toFixed(3)} (p ${(p * 100).toFixed(1)}%) · ${allowed}`;
    const table = el("table");
    for (const t of e.top_logprobs || []) {
      const row = el("tr");
      const a = el("td"), b = el("td");
      a.textContent = JSON.stringify(t.token);
      b.textContent = `${t.logprob.toFixed(3)}  (${(Math.exp(t.logprob) * 100).toFixed(1)}%)`;
      row.append(a, b);
      table.append(row);
    }
    const alt = el("div", "muted");
    alt.textContent = (e.top_logprobs || []).length ? "top alternatives:" : "no alternatives reported";
    this.detail.replaceChildren(head, alt, table);
  }
}

export function el(tag, cls) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  return e;
}
