// Parse Mermaid files with Mermaid's own parser (mermaid.parse, in jsdom for its DOM needs);
// print JSON: {file: null | "error message"}.  Usage: node mermaid-parse.mjs FILE...
import { readFileSync } from "node:fs";
import { JSDOM } from "jsdom";

const dom = new JSDOM("<!doctype html><html><body></body></html>");
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const mermaid = (await import("mermaid")).default;
mermaid.initialize({ startOnLoad: false });
const out = {};
for (const file of process.argv.slice(2)) {
  try {
    const result = await mermaid.parse(readFileSync(file, "utf8"));
    out[file] = result && result.diagramType === "flowchart-v2" ? null : `parsed as ${JSON.stringify(result)}`;
  } catch (error) {
    out[file] = String(error && error.message ? error.message : error);
  }
}
process.stdout.write(JSON.stringify(out));
