// The playground page: wires the editor, the generator and the server panel to the API of the
// server that serves it (same origin, same key).

import { Api, errorText } from "./api.js";
import { Editor } from "./editor.js";
import { Generator } from "./generate.js";
import { ServerPanel } from "./metrics.js";

const $ = (id) => document.getElementById(id);

async function connect(api) {
  const pill = $("server-state");
  const config = await api.call("GET", "/playground/config.json");
  if (config.body.api_key_required && !api.key) {
    pill.textContent = "API key needed";
    pill.className = "pill bad";
    $("key-form").hidden = false;
    $("api-key").focus();
    return false;
  }
  const models = await api.call("GET", "/v1/models");
  if (models.status === 401) {
    pill.textContent = "API key needed";
    pill.className = "pill bad";
    $("key-form").hidden = false;
    $("api-key").focus();
    return false;
  }
  if (!models.ok) {
    pill.textContent = errorText(models.body);
    pill.className = "pill bad";
    return false;
  }
  $("key-form").hidden = true;
  const card = models.body.data[0];
  if (!$("model").value) $("model").value = card.id;
  pill.textContent = `${card.id} · context ${card.context_length ?? "?"} tokens`;
  pill.className = "pill ok";
  return true;
}

function main() {
  const api = new Api();
  const editor = new Editor(api, {
    kind: $("kind"), example: $("example"), editor: $("editor"), gutter: $("gutter"),
    check: $("check"), compile: $("compile"), compileResult: $("compile-result"),
  });
  const generator = new Generator(api, editor, {
    system: $("system"), user: $("user"), model: $("model"), temperature: $("temperature"),
    maxTokens: $("max-tokens"), seed: $("seed"), n: $("n"), run: $("run"), stop: $("stop"),
    runState: $("run-state"), choices: $("choices"), costs: $("costs"), rewrites: $("rewrites"),
  });
  new ServerPanel(api, $("charts")).start();
  $("key-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    api.setKey($("api-key").value.trim());
    if (await connect(api)) start(editor);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      generator.run();
    }
  });
  connect(api).then((ok) => { if (ok) start(editor); });
}

function start(editor) {
  editor.ready = true;
  editor.schedule(0);
}

main();
