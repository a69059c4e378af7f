// Where each JSON pointer of a JSON text starts, so a refusal's pointer is shown at its line.
// A member's pointer maps to its key (where the keyword is written), an item's to its value.

export function pointerLines(text) {
  const lines = new Map();
  let i = 0;
  const breaks = [];
  for (let k = text.indexOf("\n"); k >= 0; k = text.indexOf("\n", k + 1)) breaks.push(k);
  const lineAt = (pos) => { // 1 + the newlines before pos (binary search)
    let lo = 0, hi = breaks.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (breaks[mid] < pos) lo = mid + 1; else hi = mid;
    }
    return lo + 1;
  };
  const ws = () => { while (i < text.length && " \t\r\n".includes(text[i])) i++; };
  const str = () => {
    const start = i++;
    while (i < text.length && text[i] !== '"') i += text[i] === "\\" ? 2 : 1;
    i++;
    return JSON.parse(text.slice(start, i));
  };
  const value = (ptr) => {
    ws();
    if (!lines.has(ptr)) lines.set(ptr, lineAt(i));
    const c = text[i];
    if (c === "{") {
      i++; ws();
      while (i < text.length && text[i] !== "}") {
        ws();
        const keyAt = i;
        const key = str();
        const child = `${ptr}/${escape(key)}`;
        lines.set(child, lineAt(keyAt));
        ws(); i++; // the colon
        value(child);
        ws();
        if (text[i] === ",") i++;
        else break;
      }
      i++;
    } else if (c === "[") {
      i++; ws();
      for (let n = 0; i < text.length && text[i] !== "]"; n++) {
        value(`${ptr}/${n}`);
        ws();
        if (text[i] === ",") i++;
        else break;
      }
      i++;
    } else if (c === '"') {
      str();
    } else {
      while (i < text.length && !",}] \t\r\n".includes(text[i])) i++;
    }
  };
  try {
    value("");
  } catch {
    // a text that is not JSON: whatever was mapped before the fault stays usable
  }
  return lines;
}

function escape(key) {
  return key.replaceAll("~", "~0").replaceAll("/", "~1");
}

// The line of `pointer` in `lines`, or of its longest mapped prefix (a pointer may name a
// keyword the analysis added, below what the text spells out).
export function lineOf(lines, pointer) {
  let p = pointer || "";
  for (;;) {
    if (lines.has(p)) return lines.get(p);
    const cut = p.lastIndexOf("/");
    if (cut < 0) return 1;
    p = p.slice(0, cut);
  }
}

// The line of the first syntax error in JSON `text` (browsers' JSON.parse messages do not all
// say where), or null when it parses.
export function syntaxErrorLine(text) {
  const at = syntaxErrorAt(text);
  return at === null ? null : text.slice(0, at).split("\n").length;
}

function syntaxErrorAt(text) {
  let i = 0;
  const ws = () => { while (i < text.length && " \t\r\n".includes(text[i])) i++; };
  const fail = () => { throw i; };
  const expect = (c) => { if (text[i] !== c) fail(); i++; };
  const str = () => {
    expect('"');
    while (text[i] !== '"') {
      if (i >= text.length || text.charCodeAt(i) < 0x20) fail();
      if (text[i] === "\\") {
        i++;
        if (text[i] === "u") {
          if (!/^[0-9a-fA-F]{4}$/.test(text.slice(i + 1, i + 5))) fail();
          i += 4;
        } else if (!'"\\/bfnrt'.includes(text[i])) fail();
      }
      i++;
    }
    i++;
  };
  const value = () => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++; ws();
      if (text[i] === "}") { i++; return; }
      for (;;) {
        ws(); str(); ws(); expect(":"); value(); ws();
        if (text[i] === ",") { i++; continue; }
        expect("}");
        return;
      }
    }
    if (c === "[") {
      i++; ws();
      if (text[i] === "]") { i++; return; }
      for (;;) {
        value(); ws();
        if (text[i] === ",") { i++; continue; }
        expect("]");
        return;
      }
    }
    if (c === '"') { str(); return; }
    const m = /^(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false|null)/.exec(text.slice(i));
    if (!m) fail();
    i += m[0].length;
  };
  try {
    value();
    ws();
    if (i < text.length) fail();
    return null;
  } catch (at) {
    // a number: where it failed; anything else (nesting deeper than the stack): unknown
    return typeof at === "number" ? Math.min(at, text.length) : null;
  }
}
