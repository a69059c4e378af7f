// Generate: the request from the form and the editor, streamed through /v1/chat/completions;
// each choice's text and token view as they arrive, then the page's own verdict on it, and the
// receipt and costs of the request.

import { errorText } from "./api.js";
import { regex, checkSchema } from "./schema_check.js";
import { TokenView, el } from "./tokens.js";

export class Generator {
  constructor(api, editor, els) {
    this.api = api;
    this.editor = editor;
    this.els = els;
    this.abort = null;
    els.run.addEventListener("click", () => this.run());
    els.stop.addEventListener("click", () => this.abort?.abort());
  }

  params() {
    const num = (input) => (input.value.trim() === "" ? undefined : Number(input.value));
    const messages = [];
    if (this.els.system.value.trim()) messages.push({ role: "system", content: this.els.system.value });
    messages.push({ role: "user", content: this.els.user.value });
    return {
      model: this.els.model.value || undefined,
      messages,
      temperature: num(this.els.temperature),
      max_tokens: num(this.els.maxTokens),
      seed: num(this.els.seed),
      n: num(this.els.n),
      logprobs: true,
      top_logprobs: 5,
      stream: true,
      stream_options: { include_usage: true },
    };
  }

  async run() {
    if (this.abort) return;
    const kind = this.editor.kind;
    const fields = kind === "none" ? {} : this.editor.fields();
    if (fields === null) { this.state("fix the constraint first", true); return; }
    const body = { ...this.params(), ...fields };
    const choices = new Map();
    this.els.choices.replaceChildren();
    this.abort = new AbortController();
    this.els.run.disabled = true;
    this.els.stop.disabled = false;
    this.state("generating…");
    const started = performance.now();
    const run = { started, first: null, end: null, usage: null, receipt: null, kind, fields };
    try {
      const refused = await this.api.stream(body, (chunk) => {
        if (chunk.corral) run.receipt = chunk.corral;
        if (chunk.usage) run.usage = chunk.usage;
        if (chunk.error) throw new Error(errorText(chunk));
        for (const c of chunk.choices || []) {
          if (!choices.has(c.index)) choices.set(c.index, new ChoiceView(this.els.choices, c.index));
          const got = choices.get(c.index).take(c);
          if (got && run.first === null) run.first = performance.now();
        }
      }, this.abort.signal);
      run.end = performance.now();
      if (refused) {
        this.state(`refused (${refused.status}): ${errorText(refused.body)}`, true);
      } else {
        for (const view of choices.values()) view.judge(kind, fields, this.editor.text);
        this.state(`done in ${((run.end - started) / 1000).toFixed(2)} s`);
        this.els.choices.dataset.done = String(Date.now());
      }
    } catch (e) {
      this.state(e.name === "AbortError" ? "stopped" : `failed: ${e.message}`, e.name !== "AbortError");
    } finally {
      this.abort = null;
      this.els.run.disabled = false;
      this.els.stop.disabled = true;
      this.report(run, [...choices.values()]);
    }
  }

  state(text, bad = false) {
    this.els.runState.textContent = text;
    this.els.runState.className = bad ? "error-box" : "muted";
  }

  report(run, views) {
    const r = run.receipt;
    const u = run.usage;
    const tokens = u ? u.completion_tokens : views.reduce((a, v) => a + v.tokens.entries.length, 0);
    const decode = run.first !== null && run.end !== null ? (run.end - run.first) / 1000 : null;
    const rows = [
      ["time to first token", run.first !== null ? `${(run.first - run.started).toFixed(0)} ms` : "—"],
      ["tokens per second", decode ? (tokens / decode).toFixed(1) : "—"],
      ["completion tokens", u ? String(u.completion_tokens) : String(tokens)],
      ["prompt tokens", u ? String(u.prompt_tokens) : "—"],
      ["from the radix cache", u ? `${u.prompt_tokens_details?.cached_tokens ?? 0} prompt tokens` : "—"],
      ["constraint", r ? `${r.kind} · ${r.backend} ${r.backend_version}` : "none"],
      ["cache tier", r ? r.cache : "—"],
      ["compile time", r && r.compile_ms !== undefined ? `${r.compile_ms.toFixed(1)} ms` : r ? `none (${r.cache} cache hit)` : "—"],
      ["exact", r ? (r.exact ? "yes" : "no") : "—"],
      ["finish", views.map((v) => v.finish || "—").join(", ") || "—"],
    ];
    this.els.costs.replaceChildren(...rows.flatMap(([k, v]) => {
      const dt = el("dt"), dd = el("dd");
      dt.textContent = k;
      dd.textContent = v;
      dd.dataset.key = k;
      return [dt, dd];
    }));
    const items = [];
    for (const w of r ? r.rewrites : []) items.push(rewriteItem(w));
    for (const v of views) if (v.budget) items.push(budgetItem(v));
    if (!items.length) {
      const li = el("li", "muted");
      li.textContent = r ? "none: the constraint was compiled as written" : "no constraint";
      items.push(li);
    }
    this.els.rewrites.replaceChildren(...items);
  }
}

class ChoiceView {
  constructor(parent, index) {
    this.root = el("div", "choice");
    this.root.dataset.index = String(index);
    const title = el("h3");
    title.textContent = `Choice ${index}`;
    this.output = el("pre", "output");
    this.output.setAttribute("aria-label", `choice ${index} output`);
    this.verdict = el("div", "verdict unknown");
    this.content = "";
    this.calls = [];
    this.finish = null;
    this.budget = null;
    this.root.append(title, this.output, this.verdict);
    this.tokens = new TokenView(this.root);
    parent.append(this.root);
  }

  // Takes one streamed choice delta; true when it brought output.
  take(c) {
    const d = c.delta || {};
    let got = false;
    if (d.content) { this.content += d.content; got = true; }
    for (const t of d.tool_calls || []) {
      const call = (this.calls[t.index] ||= { name: "", arguments: "" });
      if (t.function?.name) call.name = t.function.name;
      if (t.function?.arguments) call.arguments += t.function.arguments;
      got = true;
    }
    if (c.logprobs?.content) this.tokens.add(c.logprobs.content);
    if (c.finish_reason) { this.finish = c.finish_reason; this.root.dataset.finish = c.finish_reason; }
    if (c.budget_close) this.budget = c.budget_close;
    this.output.textContent = this.content
      + this.calls.map((k) => `${k.name}(${k.arguments})`).join("\n");
    return got;
  }

  judge(kind, fields, text) {
    const [state, message] = verdict(kind, fields, text, this.content, this.calls);
    this.root.dataset.verdict = state;
    this.verdict.className = `verdict ${state === "valid" ? "ok" : state === "invalid" ? "bad" : "unknown"}`;
    this.verdict.textContent = message;
  }
}

// [valid | invalid | unchecked, message]: the page's own judgement of one choice.
function verdict(kind, fields, text, content, calls) {
  if (kind === "json_schema") return jsonVerdict(fields.response_format.json_schema.schema, content, "output");
  if (kind === "regex") {
    const rx = regex(text, true);
    if (!rx) return ["unchecked", "JavaScript cannot read this regex; the server enforced it"];
    return rx.test(content) ? ["valid", "✓ matches the regex"] : ["invalid", "✗ does not match the regex"];
  }
  if (kind === "choice") {
    return fields.response_format.choice.includes(content)
      ? ["valid", "✓ one of the choices"] : ["invalid", "✗ not one of the choices"];
  }
  if (kind === "tools") {
    if (!calls.length) return ["invalid", "✗ no tool call"];
    for (const call of calls) {
      const tool = fields.tools.find((t) => t.function.name === call.name);
      if (!tool) return ["invalid", `✗ unknown function ${call.name}`];
      const [state, message] = jsonVerdict(tool.function.parameters || {}, call.arguments, `${call.name} arguments`);
      if (state !== "valid") return [state, message];
    }
    return ["valid", `✓ ${calls.length} tool call(s); arguments validate against their parameters`];
  }
  if (kind === "none") return ["unchecked", "free text: nothing to check"];
  return ["unchecked", "grammars are enforced by the server; the page does not re-parse them"];
}

function jsonVerdict(schema, text, what) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return ["invalid", `✗ the ${what} is not JSON: ${e.message}`];
  }
  const { errors, unchecked } = checkSchema(schema, value);
  const note = unchecked.length ? ` (not checked in the page: ${unchecked.join(", ")})` : "";
  if (errors.length) {
    return ["invalid", `✗ ${errors.map((e) => `${e.pointer || "/"}: ${e.message}`).join("; ")}`];
  }
  return ["valid", `✓ the ${what} validates against the schema${note}`];
}

function rewriteItem(w) {
  const li = el("li");
  const code = el("code");
  code.textContent = [w.param, w.pointer].filter(Boolean).join(" ") || "/";
  li.append(`${w.rewrite}${w.keyword ? ` (${w.keyword})` : ""}: `, code);
  if (w.detail || w.note) li.append(` ${w.detail || w.note}`);
  return li;
}

function budgetItem(v) {
  const li = el("li");
  const cut = (v.budget.cut_short || []).join(", ") || "nothing";
  li.textContent = `budget closing: ${v.budget.steered ? "steered" : "not steered"}; cut short: ${cut}`
    + (v.budget.complete === false ? " (incomplete)" : "");
  return li;
}
