// Constraints to start from, per kind, and how each kind goes into a chat request.

const json = (x) => JSON.stringify(x, null, 2);

export const EXAMPLES = {
  json_schema: [
    ["Person", json({
      type: "object",
      additionalProperties: false,
      required: ["name", "age", "city"],
      properties: {
        name: { type: "string", maxLength: 24 },
        age: { type: "integer", minimum: 0, maximum: 120 },
        city: { enum: ["Oslo", "Bergen", "Tromsø"] },
      },
    })],
    ["Point (fixed keys)", json({
      type: "object",
      additionalProperties: false,
      required: ["kind", "x", "y"],
      properties: {
        kind: { const: "point" },
        x: { type: "integer", minimum: 0, maximum: 9 },
        y: { type: "integer", minimum: 0, maximum: 9 },
      },
    })],
    ["Refused: unsatisfiable (minimum above maximum)", json({
      type: "object",
      required: ["name", "age"],
      properties: {
        name: { type: "string" },
        age: { type: "integer", minimum: 150, maximum: 120 },
      },
    })],
    ["Refused: contains", json({
      type: "object",
      required: ["tags"],
      properties: {
        tags: {
          type: "array",
          items: { type: "string" },
          contains: { const: "red" },
          minContains: 2,
        },
      },
    })],
  ],
  regex: [
    ["Phone number", "[0-9]{3}-[0-9]{4}"],
    ["ISO date", "(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"],
  ],
  lark: [
    ["Yes or no", 'start: "yes" | "no"'],
    ["Sum", 'start: expr\nexpr: NUMBER (" + " NUMBER)*\nNUMBER: /[0-9]{1,3}/'],
  ],
  ebnf: [
    ["Yes or no", 'root ::= "yes" | "no"'],
    ["Colour list", 'root ::= colour (", " colour)*\ncolour ::= "red" | "green" | "blue"'],
  ],
  choice: [
    ["Sentiment", "positive\nnegative\nneutral"],
    ["Cities", "Oslo\nBergen\nTromsø"],
  ],
  tools: [
    ["Weather", json([{
      type: "function",
      function: {
        name: "get_weather",
        description: "Current weather in a city",
        strict: true,
        parameters: {
          type: "object",
          additionalProperties: false,
          required: ["city", "unit"],
          properties: {
            city: { type: "string", maxLength: 30 },
            unit: { type: "string", enum: ["celsius", "fahrenheit"] },
          },
        },
      },
    }])],
  ],
  none: [["Free text", ""]],
};

// The request fields of constraint `text` of `kind`; throws a SyntaxError for JSON that does
// not parse (the editor shows it at its line).
export function constraintFields(kind, text) {
  switch (kind) {
    case "json_schema":
      return {
        response_format: {
          type: "json_schema",
          json_schema: { name: "playground", strict: true, schema: JSON.parse(text) },
        },
      };
    case "regex":
      return { response_format: { type: "regex", regex: text } };
    case "lark":
      return { response_format: { type: "grammar", syntax: "lark", grammar: text } };
    case "ebnf":
      return { response_format: { type: "grammar", grammar: text } };
    case "choice":
      return {
        response_format: { type: "choice", choice: text.split("\n").filter((s) => s.length > 0) },
      };
    case "tools":
      return { tools: JSON.parse(text), tool_choice: "required" };
    default:
      return {};
  }
}

// Which JSON pointer prefix of the editor's text a refusal's `param` refers to (null: the
// refusal is not about a JSON text in the editor).
export function editorPrefix(kind, param) {
  if (kind === "json_schema" && param === "response_format.json_schema.schema") return "";
  if (kind === "tools" && param) {
    const m = /^tools\[(\d+)\]\.function\.parameters$/.exec(param);
    if (m) return `/${m[1]}/function/parameters`;
    const t = /^tools\[(\d+)\]/.exec(param);
    if (t) return `/${t[1]}`;
  }
  return null;
}

export const IS_JSON = new Set(["json_schema", "tools"]);
