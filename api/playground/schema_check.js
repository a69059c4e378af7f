// The page's own judge of an output against a JSON Schema (the server's word is not taken for
// it). Covers the keywords of drafts 4 to 2020-12 that shape an instance; a keyword it does not
// check (formats, dynamic references, ...) is listed in `unchecked`, never silently passed.

const ANNOTATIONS = new Set([
  "$schema", "$id", "$comment", "$defs", "definitions", "title", "description", "default",
  "examples", "readOnly", "writeOnly", "deprecated", "$anchor", "contentMediaType",
  "contentEncoding",
]);

export function checkSchema(schema, instance) {
  const errors = [];
  const unchecked = new Set();
  const root = schema;

  const resolve = (ref) => {
    if (!ref.startsWith("#")) return undefined;
    let node = root;
    for (const part of ref.slice(1).split("/").slice(1)) {
      const key = decodeURIComponent(part).replaceAll("~1", "/").replaceAll("~0", "~");
      node = node == null ? undefined : node[key];
    }
    return node;
  };

  // true when `x` validates against `s`; errors go to `out` (a scratch list for branches)
  const check = (s, x, at, out, depth) => {
    if (depth > 64) { unchecked.add("$ref (too deep)"); return true; }
    if (s === true || s === undefined) return true;
    if (s === false) { out.push({ pointer: at, message: "no value is allowed here" }); return false; }
    const before = out.length;
    const fail = (message) => out.push({ pointer: at, message });
    for (const [k, v] of Object.entries(s)) {
      if (ANNOTATIONS.has(k)) continue;
      switch (k) {
        case "$ref": {
          const target = resolve(v);
          if (target === undefined) unchecked.add(`$ref ${v}`);
          else check(target, x, at, out, depth + 1);
          break;
        }
        case "type": {
          const types = Array.isArray(v) ? v : [v];
          if (!types.some((t) => isType(x, t))) fail(`expected ${types.join(" or ")}`);
          break;
        }
        case "enum":
          if (!v.some((e) => equal(e, x))) fail(`not one of ${JSON.stringify(v)}`);
          break;
        case "const":
          if (!equal(v, x)) fail(`not ${JSON.stringify(v)}`);
          break;
        case "properties":
          if (isObject(x)) {
            for (const [p, ps] of Object.entries(v)) {
              if (p in x) check(ps, x[p], `${at}/${esc(p)}`, out, depth + 1);
            }
          }
          break;
        case "patternProperties":
          if (isObject(x)) {
            for (const [re, ps] of Object.entries(v)) {
              const rx = regex(re, false);
              if (!rx) { unchecked.add(`patternProperties ${re}`); continue; }
              for (const p of Object.keys(x)) if (rx.test(p)) check(ps, x[p], `${at}/${esc(p)}`, out, depth + 1);
            }
          }
          break;
        case "additionalProperties":
          if (isObject(x)) {
            const declared = Object.keys(s.properties || {});
            const patterns = Object.keys(s.patternProperties || {}).map((re) => regex(re, false));
            for (const p of Object.keys(x)) {
              if (declared.includes(p) || patterns.some((rx) => rx && rx.test(p))) continue;
              if (v === false) fail(`property ${JSON.stringify(p)} is not allowed`);
              else check(v, x[p], `${at}/${esc(p)}`, out, depth + 1);
            }
          }
          break;
        case "required":
          if (isObject(x)) for (const p of v) if (!(p in x)) fail(`missing required property ${JSON.stringify(p)}`);
          break;
        case "propertyNames":
          if (isObject(x)) for (const p of Object.keys(x)) check(v, p, `${at}/${esc(p)}`, out, depth + 1);
          break;
        case "minProperties":
          if (isObject(x) && Object.keys(x).length < v) fail(`fewer than ${v} properties`);
          break;
        case "maxProperties":
          if (isObject(x) && Object.keys(x).length > v) fail(`more than ${v} properties`);
          break;
        case "dependentRequired":
          if (isObject(x)) {
            for (const [p, needs] of Object.entries(v)) {
              if (p in x) for (const q of needs) if (!(q in x)) fail(`${JSON.stringify(p)} needs ${JSON.stringify(q)}`);
            }
          }
          break;
        case "prefixItems":
          if (Array.isArray(x)) v.forEach((ps, n) => { if (n < x.length) check(ps, x[n], `${at}/${n}`, out, depth + 1); });
          break;
        case "items":
          if (Array.isArray(x)) {
            if (Array.isArray(v)) v.forEach((ps, n) => { if (n < x.length) check(ps, x[n], `${at}/${n}`, out, depth + 1); });
            else {
              const from = Array.isArray(s.prefixItems) ? s.prefixItems.length : 0;
              for (let n = from; n < x.length; n++) check(v, x[n], `${at}/${n}`, out, depth + 1);
            }
          }
          break;
        case "additionalItems":
          if (Array.isArray(x) && Array.isArray(s.items)) {
            for (let n = s.items.length; n < x.length; n++) check(v, x[n], `${at}/${n}`, out, depth + 1);
          }
          break;
        case "minItems":
          if (Array.isArray(x) && x.length < v) fail(`fewer than ${v} items`);
          break;
        case "maxItems":
          if (Array.isArray(x) && x.length > v) fail(`more than ${v} items`);
          break;
        case "uniqueItems":
          if (v && Array.isArray(x) && x.some((a, n) => x.slice(n + 1).some((b) => equal(a, b)))) fail("items are not unique");
          break;
        case "contains":
          if (Array.isArray(x)) {
            const hits = x.filter((item, n) => check(v, item, `${at}/${n}`, [], depth + 1)).length;
            const min = s.minContains ?? 1;
            if (hits < min) fail(`fewer than ${min} items match "contains"`);
            if (s.maxContains !== undefined && hits > s.maxContains) fail(`more than ${s.maxContains} items match "contains"`);
          }
          break;
        case "minContains": case "maxContains":
          break; // with "contains"
        case "minLength":
          if (typeof x === "string" && [...x].length < v) fail(`shorter than ${v} characters`);
          break;
        case "maxLength":
          if (typeof x === "string" && [...x].length > v) fail(`longer than ${v} characters`);
          break;
        case "pattern":
          if (typeof x === "string") {
            const rx = regex(v, false);
            if (!rx) unchecked.add(`pattern ${v}`);
            else if (!rx.test(x)) fail(`does not match ${v}`);
          }
          break;
        case "minimum":
          if (typeof x === "number" && (s.exclusiveMinimum === true ? x <= v : x < v)) fail(`below ${v}`);
          break;
        case "maximum":
          if (typeof x === "number" && (s.exclusiveMaximum === true ? x >= v : x > v)) fail(`above ${v}`);
          break;
        case "exclusiveMinimum":
          if (typeof v === "number" && typeof x === "number" && x <= v) fail(`not above ${v}`);
          break;
        case "exclusiveMaximum":
          if (typeof v === "number" && typeof x === "number" && x >= v) fail(`not below ${v}`);
          break;
        case "multipleOf":
          if (typeof x === "number" && Math.abs(x / v - Math.round(x / v)) > 1e-9) fail(`not a multiple of ${v}`);
          break;
        case "allOf":
          v.forEach((b) => check(b, x, at, out, depth + 1));
          break;
        case "anyOf":
          if (!v.some((b) => check(b, x, at, [], depth + 1))) fail("matches none of anyOf");
          break;
        case "oneOf": {
          const n = v.filter((b) => check(b, x, at, [], depth + 1)).length;
          if (n !== 1) fail(`matches ${n} branches of oneOf, not exactly one`);
          break;
        }
        case "not":
          if (check(v, x, at, [], depth + 1)) fail("matches the schema under not");
          break;
        case "if": {
          const branch = check(v, x, at, [], depth + 1) ? s.then : s.else;
          if (branch !== undefined) check(branch, x, at, out, depth + 1);
          break;
        }
        case "then": case "else":
          break; // with "if"
        default:
          unchecked.add(k);
      }
    }
    return out.length === before;
  };

  check(schema, instance, "", errors, 0);
  return { errors, unchecked: [...unchecked] };
}

function isObject(x) {
  return x !== null && typeof x === "object" && !Array.isArray(x);
}

function isType(x, t) {
  switch (t) {
    case "object": return isObject(x);
    case "array": return Array.isArray(x);
    case "string": return typeof x === "string";
    case "boolean": return typeof x === "boolean";
    case "null": return x === null;
    case "number": return typeof x === "number";
    case "integer": return typeof x === "number" && Number.isInteger(x);
    default: return false;
  }
}

function equal(a, b) {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a), kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => k in b && equal(a[k], b[k]));
}

function esc(key) {
  return key.replaceAll("~", "~0").replaceAll("/", "~1");
}

// A JSON Schema / Python regex as a JavaScript one (searched, or matched whole with `whole`);
// null where JavaScript cannot read it.
export function regex(source, whole) {
  try {
    return new RegExp(whole ? `^(?:${source})$` : source, "u");
  } catch {
    return null;
  }
}
