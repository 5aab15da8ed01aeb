"""`durapipe lsp` driven as an editor drives it: a subprocess over stdio, through pytest-lsp.

pytest-lsp checks every response against the LSP specification; the server's stderr is
forwarded to this process, where ``capfd`` reads it: a clean server writes nothing there.
"""

from __future__ import annotations

import sys

import pytest

pytest_lsp = pytest.importorskip("pytest_lsp", reason="the `test` extra installs pytest-lsp")
from lsprotocol import types as t
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from tests.conftest import REPO_ROOT

PREP = REPO_ROOT / "examples" / "prep_train_eval.pipe"


@pytest_lsp.fixture(config=ClientServerConfig(
    server_command=[sys.executable, "-m", "durapipe", "lsp", "--stdio"]))
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(t.InitializeParams(
        capabilities=client_capabilities("visual-studio-code"),
        root_uri=REPO_ROOT.as_uri()))
    yield
    await lsp_client.shutdown_session()


def _uri(name: str) -> str:
    return (REPO_ROOT / "examples" / name).as_uri()


async def _open(client: LanguageClient, uri: str, text: str) -> list[t.Diagnostic]:
    client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id="durapipe", version=1, text=text)))
    await client.wait_for_notification(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    return list(client.diagnostics[uri])


def _pos(text: str, needle: str, delta: int = 0) -> t.Position:
    offset = text.index(needle) + delta
    line = text.count("\n", 0, offset)
    return t.Position(line=line, character=offset - (text.rfind("\n", 0, offset) + 1))


def _assert_clean(client: LanguageClient, capfd: pytest.CaptureFixture[str]) -> None:
    errors = [m.message for m in client.log_messages if m.type == t.MessageType.Error]
    assert errors == []
    assert client.error is None
    assert capfd.readouterr().err == ""


@pytest.mark.asyncio
async def test_open_reports_the_front_ends_diagnostics_and_edit_clears_them(
        client: LanguageClient, capfd: pytest.CaptureFixture[str]) -> None:
    text = PREP.read_text().replace("memory = 64Gi", "memroy = 64Gi")
    uri = _uri("edited.pipe")
    diagnostics = await _open(client, uri, text)
    assert [d.code for d in diagnostics] == ["P0201"]
    assert diagnostics[0].range.start == _pos(text, "memroy")
    assert "did you mean `memory`?" in diagnostics[0].message
    # The quick fix the suggestion describes, applied, gives the original text back.
    actions = await client.text_document_code_action_async(t.CodeActionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), range=diagnostics[0].range,
        context=t.CodeActionContext(diagnostics=diagnostics)))
    assert actions is not None and len(actions) == 1
    action = actions[0]
    assert isinstance(action, t.CodeAction) and action.edit and action.edit.changes
    (edit,) = action.edit.changes[uri]
    assert edit.new_text == "memory" and edit.range == diagnostics[0].range
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[t.TextDocumentContentChangePartial(range=edit.range,
                                                            text=edit.new_text)]))
    await client.wait_for_notification(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    assert list(client.diagnostics[uri]) == []
    # The code's explanation is one hover away.
    hover = await client.text_document_hover_async(t.HoverParams(
        text_document=t.TextDocumentIdentifier(uri=_uri("second.pipe")),
        position=t.Position(line=0, character=0)))
    assert hover is None  # not open: nothing to say
    _assert_clean(client, capfd)


@pytest.mark.asyncio
async def test_diagnostic_hover_shows_the_explanation(client: LanguageClient) -> None:
    text = PREP.read_text().replace("cpu = 4  memory = 16Gi", "cpu = 4, memory = 16Gi", 1)
    uri = _uri("comma.pipe")
    diagnostics = await _open(client, uri, text)
    assert [d.code for d in diagnostics] == ["P0104"]
    hover = await client.text_document_hover_async(t.HoverParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=diagnostics[0].range.start))
    assert hover is not None and isinstance(hover.contents, t.MarkupContent)
    assert "**P0104**: comma between attributes" in hover.contents.value
    assert "Commas separate list items only" in hover.contents.value


async def _complete(client: LanguageClient, uri: str, text: str, needle: str,
                    delta: int) -> list[str]:
    result = await client.text_document_completion_async(t.CompletionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=_pos(text, needle, delta)))
    assert isinstance(result, t.CompletionList)
    return [item.label for item in result.items]


@pytest.mark.asyncio
async def test_completion_in_context(client: LanguageClient,
                                     capfd: pytest.CaptureFixture[str]) -> None:
    text = PREP.read_text() + (
        '\nstage "report" {\n  retry {  }\n  resources { gpu { types = [] } }\n'
        '  command = [params.]\n  needs = []\n  args = [prep.outputs.]\n}\n')
    uri = _uri("complete.pipe")
    await _open(client, uri, text)
    retry = await _complete(client, uri, text, "retry {  }", len("retry { "))
    assert {"attempts", "preemptions", "backoff", "on_oom"} <= set(retry)
    assert "image" not in retry
    gpus = await _complete(client, uri, text, "types = []", len("types = ["))
    assert '"H100"' in gpus and '"A100-80GB"' in gpus
    params = await _complete(client, uri, text, "[params.]", len("[params."))
    assert params == ["snapshot", "max_depth"]
    needs = await _complete(client, uri, text, "needs = []", len("needs = ["))
    assert needs == ["prep", "train", "eval"]
    outputs = await _complete(client, uri, text, "[prep.outputs.]", len("[prep.outputs."))
    assert outputs == ["data"]
    _assert_clean(client, capfd)


@pytest.mark.asyncio
async def test_hover_definition_references(client: LanguageClient,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    text = (REPO_ROOT / "examples" / "spot_training.pipe").read_text()
    uri = _uri("spot.pipe")
    assert await _open(client, uri, text) == []

    async def hover_at(needle: str, delta: int = 1) -> str:
        hover = await client.text_document_hover_async(t.HoverParams(
            text_document=t.TextDocumentIdentifier(uri=uri), position=_pos(text, needle, delta)))
        assert hover is not None and isinstance(hover.contents, t.MarkupContent)
        return hover.contents.value

    retry = await hover_at("retry {")
    assert "**Compiles to** (stage `train`)" in retry
    assert "preemptions: up to 10 for the whole stage" in retry
    memory = await hover_at("64Gi")
    assert "68,719,476,736 bytes" in memory
    attempts = await hover_at("attempts    =")
    assert "Retries after an application failure" in attempts

    text2 = PREP.read_text()
    uri2 = _uri("refs.pipe")
    await _open(client, uri2, text2)
    at_ref = _pos(text2, "prep.outputs.data", 1)
    found = await client.text_document_definition_async(t.DefinitionParams(
        text_document=t.TextDocumentIdentifier(uri=uri2), position=at_ref))
    assert isinstance(found, list) and len(found) == 1
    assert found[0].range.start == _pos(text2, 'prep"')
    refs = await client.text_document_references_async(t.ReferenceParams(
        text_document=t.TextDocumentIdentifier(uri=uri2), position=at_ref,
        context=t.ReferenceContext(include_declaration=True)))
    assert refs is not None and len(refs) == 3  # the label and two `prep.outputs.data`
    param = await client.text_document_definition_async(t.DefinitionParams(
        text_document=t.TextDocumentIdentifier(uri=uri2),
        position=_pos(text2, "params.max_depth", len("params.m"))))
    assert isinstance(param, list) and param[0].range.start == _pos(text2, "max_depth: int")
    symbols = await client.text_document_document_symbol_async(t.DocumentSymbolParams(
        text_document=t.TextDocumentIdentifier(uri=uri2)))
    assert symbols is not None
    assert [s.name for s in symbols] == ["churn-model", "params", "defaults", "prep", "train",
                                         "eval"]
    _assert_clean(client, capfd)


@pytest.mark.asyncio
async def test_formatting_is_durapipe_fmt(client: LanguageClient) -> None:
    from durapipe.dsl.fmt import format_source

    text = PREP.read_text().replace("  namespace = ", "namespace    =  ")
    uri = _uri("fmt.pipe")
    await _open(client, uri, text)
    edits = await client.text_document_formatting_async(t.DocumentFormattingParams(
        text_document=t.TextDocumentIdentifier(uri=uri),
        options=t.FormattingOptions(tab_size=2, insert_spaces=True)))
    assert edits is not None and len(edits) == 1
    assert edits[0].new_text == format_source(text)[0] == PREP.read_text()


@pytest.mark.asyncio
async def test_a_file_with_many_mistakes(client: LanguageClient,
                                         capfd: pytest.CaptureFixture[str]) -> None:
    text = ('pipeline "x" {\n  namespce = "a"\n}\n'
            'stage "a" {\n  image: "i"\n  comand = ["x"]\n  retry { attempts = -1 }\n'
            '  resources { memory = 12Qi  gpu { types = ["H1OO"] } }\n'
            '  needs = [nobody]\n  env { A = \'x\' }\n')
    uri = _uri("mistakes.pipe")
    diagnostics = await _open(client, uri, text)
    assert len(diagnostics) >= 5
    assert {"P0101", "P0105", "P0103"} <= {str(d.code) for d in diagnostics}
    actions = await client.text_document_code_action_async(t.CodeActionParams(
        text_document=t.TextDocumentIdentifier(uri=uri),
        range=t.Range(start=t.Position(line=0, character=0),
                      end=t.Position(line=20, character=0)),
        context=t.CodeActionContext(diagnostics=diagnostics)))
    assert actions is not None
    titles = {a.title for a in actions if isinstance(a, t.CodeAction)}
    assert {"Write `=`", "Write \"x\"", "Insert the missing `}`"} <= titles
    _assert_clean(client, capfd)


@pytest.mark.asyncio
async def test_typing_every_prefix_of_an_example_never_fails(
        client: LanguageClient, capfd: pytest.CaptureFixture[str]) -> None:
    """A file grows from empty, keystroke by keystroke; after each one the client asks for
    completion and hover, as an editor does, and every answer is valid (pytest-lsp checks)."""
    text = (REPO_ROOT / "examples" / "gpu_fallback.pipe").read_text()
    uri = _uri("typed.pipe")
    await _open(client, uri, "")
    for i, char in enumerate(text):
        before = text[:i]
        line = before.count("\n")
        col = i - (before.rfind("\n") + 1)
        client.text_document_did_change(t.DidChangeTextDocumentParams(
            text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=i + 2),
            content_changes=[t.TextDocumentContentChangePartial(
                range=t.Range(start=t.Position(line=line, character=col),
                              end=t.Position(line=line, character=col)), text=char)]))
        after = t.Position(line=line + (char == "\n"), character=0 if char == "\n" else col + 1)
        if i % 3 == 0:
            await client.text_document_completion_async(t.CompletionParams(
                text_document=t.TextDocumentIdentifier(uri=uri), position=after))
        if i % 5 == 0:
            await client.text_document_hover_async(t.HoverParams(
                text_document=t.TextDocumentIdentifier(uri=uri), position=after))
    symbols = await client.text_document_document_symbol_async(t.DocumentSymbolParams(
        text_document=t.TextDocumentIdentifier(uri=uri)))
    assert symbols is not None and [s.name for s in symbols][:1] == ["llm-finetune"]
    await client.wait_for_notification(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    assert list(client.diagnostics[uri]) == []
    _assert_clean(client, capfd)


@pytest.mark.asyncio
async def test_builder_py_files_are_left_alone(client: LanguageClient) -> None:
    uri = (REPO_ROOT / "examples" / "spot_training.py").as_uri()
    client.text_document_did_open(t.DidOpenTextDocumentParams(text_document=t.TextDocumentItem(
        uri=uri, language_id="python", version=1, text="import durapipe\nx = (\n")))
    hover = await client.text_document_hover_async(t.HoverParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=0, character=1)))
    assert hover is None
    assert uri not in client.diagnostics


@pytest.mark.asyncio
async def test_a_large_file_is_analysed_piecewise_with_the_same_diagnostics(
        client: LanguageClient, capfd: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from check_bench import generate

    from durapipe.dsl import loads
    from durapipe.lsp.analysis import PIECEWISE_CHARS

    text = generate(300)
    assert len(text) > PIECEWISE_CHARS
    uri = _uri("large.pipe")
    assert await _open(client, uri, text) == []
    edited = text.replace('stage "s150" {', 'stage "s150" {\n  memroy = 1Gi', 1).replace(
        "s200.outputs.data", "s200.outputs.dat", 1)
    client.text_document_did_change(t.DidChangeTextDocumentParams(
        text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=2),
        content_changes=[t.TextDocumentContentChangeWholeDocument(text=edited)]))
    await client.wait_for_notification(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    got = [(d.code, d.range.start.line) for d in client.diagnostics[uri]]
    want = [(d.code, d.span.line - 1) for d in loads(edited).diagnostics if d.span]
    assert got == want and {"P0201", "P0301"} <= {c for c, _ in got}
    _assert_clean(client, capfd)


@pytest.mark.asyncio
async def test_a_document_over_the_size_limit_gets_one_diagnostic_at_once(
        client: LanguageClient) -> None:
    """10 MB took 75 s of analysis at 1.3 GiB; the front end's one limit now refuses it whole
    (docs/editors.md). The bound is the user's wait for the verdict, generous for a loaded
    machine: the refusal itself is a size check."""
    import asyncio
    import time

    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from check_bench import generate

    text = generate(50_000)
    assert len(text) > 10_000_000
    uri = _uri("huge.pipe")
    started = time.monotonic()
    diagnostics = await asyncio.wait_for(_open(client, uri, text), timeout=60)
    waited = time.monotonic() - started
    assert [d.code for d in diagnostics] == ["P0003"]
    assert diagnostics[0].range.start == t.Position(line=0, character=0)
    assert f"{len(text):,} bytes; the limit is 4,194,304 bytes" in diagnostics[0].message
    assert waited < 15, f"{waited:.1f} s for the P0003 of a 10 MB document"
    # Completion and formatting stay as cheap: nothing to offer, nothing to format.
    completion = await client.text_document_completion_async(t.CompletionParams(
        text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=9, character=0)))
    assert isinstance(completion, t.CompletionList) and not completion.items
    assert await client.text_document_formatting_async(t.DocumentFormattingParams(
        text_document=t.TextDocumentIdentifier(uri=uri),
        options=t.FormattingOptions(tab_size=2, insert_spaces=True))) is None
    assert time.monotonic() - started < 30
