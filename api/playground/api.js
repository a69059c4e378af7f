// The server's API, same origin: the key (asked for when the server needs one), JSON calls and
// the chat completion stream (server-sent events read from fetch's body).

const KEY_ITEM = "corral-playground-key";

export class Api {
  constructor() {
    this.key = sessionStorage.getItem(KEY_ITEM) || "";
  }

  setKey(key) {
    this.key = key;
    sessionStorage.setItem(KEY_ITEM, key);
  }

  headers() {
    const h = { "Content-Type": "application/json" };
    if (this.key) h.Authorization = `Bearer ${this.key}`;
    return h;
  }

  // {ok, status, body}: body is the parsed JSON (an OpenAI error object on a 4xx or 5xx).
  async call(method, path, body, signal) {
    const init = { method, headers: this.headers(), signal };
    if (body !== undefined) init.body = JSON.stringify(body);
    const r = await fetch(path, init);
    let parsed = null;
    try {
      parsed = await r.json();
    } catch {
      parsed = { error: { message: `${r.status} ${r.statusText}` } };
    }
    return { ok: r.ok, status: r.status, body: parsed };
  }

  text(path, signal) {
    return fetch(path, { signal, cache: "no-store" }).then((r) => r.text());
  }

  // Streams a chat completion: onEvent(chunk) for each `data:` event until [DONE]; returns the
  // {status, body} of a refusal that came before the stream started, else null.
  async stream(body, onEvent, signal) {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: this.headers(), body: JSON.stringify(body), signal,
    });
    if (!r.ok) return { status: r.status, body: await r.json().catch(() => ({})) };
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffered += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, cut);
        buffered = buffered.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") return null;
          onEvent(JSON.parse(data));
        }
      }
    }
    return null;
  }
}

// The message of an OpenAI-shaped error body (Corral's name the param, pointer and keyword).
export function errorText(body) {
  const e = (body && body.error) || {};
  return e.message || "unknown error";
}
