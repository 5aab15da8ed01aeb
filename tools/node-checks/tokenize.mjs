// Tokenise files with a TextMate grammar exactly as VS Code does (vscode-textmate on
// vscode-oniguruma); print JSON: {file: [[line, start, end, [scopes...]], ...]}.
// Usage: node tokenize.mjs GRAMMAR.json FILE...
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import vsctm from "vscode-textmate";
import oniguruma from "vscode-oniguruma";

const require = createRequire(import.meta.url);
const wasm = readFileSync(require.resolve("vscode-oniguruma/release/onig.wasm")).buffer;
await oniguruma.loadWASM(wasm);

const [grammarPath, ...files] = process.argv.slice(2);
const registry = new vsctm.Registry({
  onigLib: Promise.resolve({
    createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
    createOnigString: (s) => new oniguruma.OnigString(s),
  }),
  loadGrammar: async () => vsctm.parseRawGrammar(readFileSync(grammarPath, "utf8"), grammarPath),
});
const grammar = await registry.loadGrammar("source.durapipe");
const out = {};
for (const file of files) {
  const lines = readFileSync(file, "utf8").split("\n");
  let stack = vsctm.INITIAL;
  const tokens = [];
  lines.forEach((line, i) => {
    const result = grammar.tokenizeLine(line, stack);
    for (const tok of result.tokens) {
      tokens.push([i, tok.startIndex, Math.min(tok.endIndex, line.length), tok.scopes]);
    }
    stack = result.ruleStack;
  });
  out[file] = tokens;
}
process.stdout.write(JSON.stringify(out));
