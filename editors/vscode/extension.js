// Starts `durapipe lsp` (stdio) for .pipe files; everything else is the server's job.
const vscode = require("vscode");
const { LanguageClient } = require("vscode-languageclient/node");

let client;

function activate(context) {
  const [command, ...args] = vscode.workspace.getConfiguration("durapipe").get("command");
  client = new LanguageClient(
    "durapipe",
    "durapipe",
    { command, args: [...args, "--stdio"] },
    { documentSelector: [{ scheme: "file", language: "durapipe" }] },
  );
  context.subscriptions.push(client);
  return client.start();
}

function deactivate() {
  return client ? client.stop() : undefined;
}

module.exports = { activate, deactivate };
