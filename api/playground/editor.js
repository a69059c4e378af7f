// The constraint editor: kind, examples, the text with line numbers, checking as you type
// through /v1/constraints/validate (a refusal marked at the line its JSON pointer names) and
// precompiling through /v1/constraints.

import { errorText } from "./api.js";
import { EXAMPLES, IS_JSON, constraintFields, editorPrefix } from "./examples.js";
import { lineOf, pointerLines, syntaxErrorLine } from "./pointers.js";

const CHECK_DELAY_MS = 350;

export class Editor {
  constructor(api, els) {
    this.api = api;
    this.els = els;
    this.timer = null;
    this.seq = 0; // the newest check: older answers are dropped
    this.errorLine = null;
    this.ready = false; // no checks before the page knows the server's key
    this.onReceipt = () => {};
    els.kind.addEventListener("change", () => this.loadKind());
    els.example.addEventListener("change", () => this.loadExample());
    els.editor.addEventListener("input", () => { this.renderGutter(); this.schedule(); });
    els.editor.addEventListener("scroll", () => { els.gutter.scrollTop = els.editor.scrollTop; });
    els.editor.addEventListener("keydown", (e) => this.keydown(e));
    els.compile.addEventListener("click", () => this.compile());
    this.loadKind();
  }

  get kind() { return this.els.kind.value; }
  get text() { return this.els.editor.value; }

  set text(value) {
    this.els.editor.value = value;
    this.renderGutter();
    this.schedule(0);
  }

  loadKind() {
    const sel = this.els.example;
    sel.replaceChildren(...EXAMPLES[this.kind].map(([name], i) => new Option(name, String(i))));
    this.els.editor.disabled = this.kind === "none";
    this.loadExample();
  }

  loadExample() {
    this.text = EXAMPLES[this.kind][Number(this.els.example.value) || 0][1];
  }

  // Tab indents (two spaces) instead of leaving the editor; Escape then Tab leaves it.
  keydown(e) {
    if (e.key === "Escape") { this.escaped = true; return; }
    if (e.key === "Tab" && !e.shiftKey && !this.escaped) {
      e.preventDefault();
      const t = this.els.editor;
      t.setRangeText("  ", t.selectionStart, t.selectionEnd, "end");
      this.renderGutter();
      this.schedule();
    }
    this.escaped = false;
  }

  renderGutter() {
    const count = this.text.split("\n").length;
    const rows = [];
    for (let n = 1; n <= count; n++) {
      const span = document.createElement("span");
      span.textContent = String(n);
      if (n === this.errorLine) {
        span.className = "err";
        span.title = "the refusal is here";
      }
      rows.push(span, "\n");
    }
    this.els.gutter.replaceChildren(...rows);
    this.els.gutter.scrollTop = this.els.editor.scrollTop;
  }

  schedule(delay = CHECK_DELAY_MS) {
    clearTimeout(this.timer);
    if (!this.ready) return;
    this.timer = setTimeout(() => this.check(false), delay);
  }

  // The request fields, or null after showing why there are none (JSON that does not parse).
  fields() {
    try {
      return constraintFields(this.kind, this.text);
    } catch (e) {
      this.show(false, `JSON syntax: ${e.message}`, syntaxErrorLine(this.text) || 1);
      return null;
    }
  }

  async check(compile) {
    const seq = ++this.seq;
    if (this.kind === "none") {
      this.show(true, "no constraint: the model writes free text", null);
      return null;
    }
    const fields = this.fields();
    if (fields === null) return null;
    this.show(null, compile ? "compiling…" : "checking…", this.errorLine);
    const path = compile ? "/v1/constraints" : "/v1/constraints/validate";
    let r;
    try {
      r = await this.api.call("POST", path, fields);
    } catch (e) {
      if (seq === this.seq) this.show(false, `the server did not answer: ${e.message}`, null);
      return null;
    }
    if (seq !== this.seq) return null;
    if (!r.ok) {
      this.show(false, errorText(r.body), this.refusalLine(r.body));
      return null;
    }
    const receipt = r.body.corral;
    this.show(true, describe(receipt, compile), null);
    this.onReceipt(receipt);
    return receipt;
  }

  async compile() {
    const receipt = await this.check(true);
    let text = "";
    if (receipt && receipt.cache === "compiled") text = `compiled into the server's cache${ms(receipt.compile_ms).replace(",", " in")}`;
    else if (receipt) text = `already in the server's cache (${receipt.cache} hit)`;
    this.els.compileResult.textContent = text;
  }

  refusalLine(body) {
    const e = (body && body.error) || {};
    if (!IS_JSON.has(this.kind)) return /line (\d+)/.exec(e.message || "")?.[1] * 1 || 1;
    const prefix = editorPrefix(this.kind, e.param);
    if (prefix === null) return 1;
    return lineOf(pointerLines(this.text), prefix + (e.pointer || ""));
  }

  // ok: true (fine), false (refused), null (pending); line: the line to mark, or null.
  show(ok, message, line) {
    const c = this.els.check;
    c.className = `check ${ok === true ? "ok" : ok === false ? "bad" : ""}`;
    c.textContent = (line && ok === false ? `line ${line}: ` : "") + message;
    c.dataset.line = line && ok === false ? String(line) : "";
    this.errorLine = ok === false ? line : null;
    this.renderGutter();
  }
}

function ms(v) {
  return v === undefined || v === null ? "" : `, ${v.toFixed(1)} ms`;
}

function describe(receipt, compiled) {
  const how = receipt.cache === "compiled"
    ? `compiled${ms(receipt.compile_ms).replace(",", " in")}`
    : `from the ${receipt.cache} cache`;
  const exact = receipt.exact ? "enforced exactly" : "not every keyword is enforced";
  const rewrites = receipt.rewrites.length ? ` · ${receipt.rewrites.length} rewrite(s)` : "";
  return `✓ ${exact} · ${how}${rewrites}${compiled ? " · precompiled" : ""}`;
}
