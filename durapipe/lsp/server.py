"""``durapipe lsp``: the language server, on pygls over stdio.

Concurrency: the front end's parser keeps its state in module globals (it is not re-entrant
yet), so every call into it (analysis and ``fmt``) runs on ONE worker thread, in order.  The
event loop never parses: it debounces edits, reads finished analyses and answers from them.
Stale work is dropped twice over: a newer edit cancels the debounce of the older one, and a job
that reaches the worker after its text was replaced returns without parsing.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import functools
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from lsprotocol import types as t
from pygls.exceptions import JsonRpcException, JsonRpcInvalidRequest
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from durapipe import __version__
from durapipe.dsl import diagnostics as dg
from durapipe.dsl.source import MAX_SOURCE_BYTES, utf8_size
from durapipe.lsp import analysis as an
from durapipe.lsp import complete as cp
from durapipe.lsp import fixes as fx
from durapipe.lsp import framing as fr
from durapipe.lsp.incremental import PieceParser

#: Quiet time after a keystroke before the file is analysed (a burst costs one analysis).  On
#: a large file a longer wait would not save work: while one analysis runs, the edits after it
#: queue, and only the newest text is analysed when the worker is free.
DEBOUNCE_S = 0.04

log = logging.getLogger("durapipe.lsp")


class Positions:
    """Offsets <-> LSP positions for one text, in the negotiated encoding (UTF-16 default)."""

    def __init__(self, text: str, encoding: str = t.PositionEncodingKind.Utf16):
        self.text = text
        self.encoding = encoding
        starts = [0]
        find = text.find
        pos = find("\n")
        while pos != -1:
            starts.append(pos + 1)
            pos = find("\n", pos + 1)
        self.starts = starts

    def _units(self, chunk: str) -> int:
        if chunk.isascii() or self.encoding == t.PositionEncodingKind.Utf32:
            return len(chunk)
        if self.encoding == t.PositionEncodingKind.Utf8:
            return len(chunk.encode("utf-8"))
        return len(chunk.encode("utf-16-le")) // 2

    def position(self, offset: int) -> t.Position:
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.starts, offset) - 1
        return t.Position(line=line, character=self._units(self.text[self.starts[line]:offset]))

    def offset(self, position: t.Position) -> int:
        if position.line >= len(self.starts):
            return len(self.text)
        start = self.starts[position.line]
        end = self.starts[position.line + 1] - 1 if position.line + 1 < len(self.starts) \
            else len(self.text)
        line = self.text[start:end]
        if line.isascii() or self.encoding == t.PositionEncodingKind.Utf32:
            return start + min(position.character, len(line))
        units = 0
        for i, char in enumerate(line):
            if units >= position.character:
                return start + i
            units += self._units(char)
        return end

    def range(self, start: int, end: int) -> t.Range:
        return t.Range(start=self.position(start), end=self.position(end))


@dataclass
class _Job:
    text: str
    future: asyncio.Future[an.Analysis | None]


class DurapipeServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("durapipe", __version__,
                         text_document_sync_kind=t.TextDocumentSyncKind.Incremental)
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="durapipe-analysis")
        self.analyses: dict[str, an.Analysis] = {}
        self.latest: dict[str, str] = {}
        self.jobs: dict[str, _Job] = {}
        #: Per document, parsed top-level blocks of earlier versions (worker thread only).
        self.pieces: dict[str, PieceParser] = {}
        self.debounces: dict[str, asyncio.Task[None]] = {}
        self._positions: dict[str, Positions] = {}
        #: Documents the client has open; others (a builder `.py`, a file on disk) get nothing.
        self.open: set[str] = set()

    def handles(self, uri: str) -> bool:
        return uri in self.open and is_pipe(uri)

    # -- texts and positions --------------------------------------------------------------

    def text(self, uri: str) -> str:
        return self.workspace.get_text_document(uri).source

    def positions(self, uri: str, text: str) -> Positions:
        cached = self._positions.get(uri)
        if cached is None or cached.text is not text:
            encoding = self.server_capabilities.position_encoding or \
                t.PositionEncodingKind.Utf16
            cached = self._positions[uri] = Positions(text, encoding)
        return cached

    # -- analysis on the one worker thread -------------------------------------------------

    def _analyse(self, uri: str, text: str, previous: an.Analysis | None) -> an.Analysis | None:
        if self.latest.get(uri) is not text:
            return None  # replaced while queued: a newer job analyses the newer text
        pieces = self.pieces.setdefault(uri, PieceParser())
        return an.analyse(text, _path_of(uri), previous, pieces)

    async def analysis(self, uri: str) -> an.Analysis | None:
        """The analysis of the document's current text, waiting for it if needed."""
        while True:
            text = self.text(uri)
            self.latest[uri] = text
            done = self.analyses.get(uri)
            if done is not None and done.text is text:
                return done
            job = self.jobs.get(uri)
            if job is None or job.text is not text:
                loop = asyncio.get_running_loop()
                future = loop.run_in_executor(self.worker, self._analyse, uri, text, done)
                job = self.jobs[uri] = _Job(text, asyncio.ensure_future(future))
            result = await job.future
            if result is not None:
                if self.jobs.get(uri) is job:
                    del self.jobs[uri]
                if self.latest.get(uri) is result.text:
                    self.analyses[uri] = result
                    return result
            if uri not in self.latest:
                return None  # closed meanwhile

    async def current(self, uri: str) -> tuple[an.Analysis, Positions] | None:
        """The document's current analysis and its positions; ``None`` for what we leave."""
        result = await self.analysis(uri) if self.handles(uri) else None
        if result is None:
            return None
        return result, self.positions(uri, result.text)

    def schedule(self, uri: str, delay: float) -> None:
        if not self.handles(uri):
            return
        self.latest[uri] = self.text(uri)
        old = self.debounces.pop(uri, None)
        if old is not None:
            old.cancel()
        self.debounces[uri] = asyncio.get_running_loop().create_task(self._publish(uri, delay))

    async def _publish(self, uri: str, delay: float) -> None:
        try:
            if delay:
                await asyncio.sleep(delay)
            result = await self.analysis(uri)
        except asyncio.CancelledError:
            return
        except Exception:  # a bug: report it where the user and the tests see it
            log.exception("durapipe lsp: internal error analysing %s", uri)
            self.window_log_message(t.LogMessageParams(
                type=t.MessageType.Error, message=f"durapipe: internal error analysing {uri}"))
            return
        if result is None or self.latest.get(uri) is not result.text:
            return
        version = self.workspace.get_text_document(uri).version
        positions = self.positions(uri, result.text)
        self.text_document_publish_diagnostics(t.PublishDiagnosticsParams(
            uri=uri, version=version,
            diagnostics=[to_lsp(d, uri, positions) for d in result.diagnostics]))

    # -- the stdio transport: durapipe's reader (``framing``) in place of pygls's ------------

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """pygls's stdio server, reading messages with :class:`framing.FrameReader`: pygls's
        own reader died on a huge ``Content-Length`` and lost its place after a bad one.

        stdin is read with ``os.read`` on its descriptor, not through ``sys.stdin.buffer``: a
        daemon thread blocked inside a buffered read holds its lock, and the interpreter
        aborts at exit when it cannot take it."""
        fd = (stdin or sys.stdin).fileno()
        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        shutdown: Callable[[], None] = self.shutdown  # pygls does not annotate it
        try:
            asyncio.run(self._serve(fr.FrameReader(functools.partial(os.read, fd))))
        except BrokenPipeError:
            log.error("the connection to the client is lost; shutting down")
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            shutdown()

    async def _serve(self, reader: fr.FrameReader) -> None:
        """Handle what a reader thread reads, in order, on the event loop.  The thread is a
        daemon, so a read blocked on stdin never holds up the exit."""
        loop = asyncio.get_running_loop()
        batches: asyncio.Queue[list[fr.Event]] = asyncio.Queue(maxsize=1)

        def pump() -> None:
            while True:
                try:
                    events = reader.read()
                except OSError as exc:
                    log.error("cannot read stdin: %s", exc)
                    events = []
                try:
                    asyncio.run_coroutine_threadsafe(batches.put(events), loop).result()
                except (RuntimeError, concurrent.futures.CancelledError):
                    return  # the loop has closed: the server is exiting
                if not events:
                    return

        threading.Thread(target=pump, name="durapipe-lsp-stdin", daemon=True).start()
        while self._stop_event is not None and not self._stop_event.is_set():
            events = await batches.get()
            if not events:
                return  # the end of the input
            for event in events:
                self._receive(event)

    def _receive(self, event: fr.Event) -> None:
        if isinstance(event, fr.Skipped):
            log.warning("skipped %s bytes of input: %s", f"{event.size:,}", event.reason)
            self._refuse(fr.request_id(event), JsonRpcInvalidRequest(
                f"durapipe lsp: the request was not read: {event.reason}"))
            return
        try:
            data = json.loads(event.body)
        except ValueError:  # UnicodeDecodeError is one
            log.warning("skipped a message of %s bytes that is not JSON", f"{len(event.body):,}")
            return
        msg_id = fr.message_request_id(data)
        if not isinstance(data, dict) or "jsonrpc" not in data:
            log.warning("skipped a message that is not a JSON-RPC object")
            self._refuse(msg_id, JsonRpcInvalidRequest("durapipe lsp: not a JSON-RPC message"))
            return
        try:
            message = self.protocol.structure_message(data)
        except JsonRpcException as error:  # pygls never answered it
            log.warning("skipped a %s message: %s", data.get("method", "response"), error)
            self._refuse(msg_id, error)
            return
        try:
            self.protocol.handle_message(message)
        except Exception:  # pygls answers a failing request itself; this is anything else
            log.exception("cannot handle a message")

    def _refuse(self, msg_id: int | str | None, error: JsonRpcException) -> None:
        """Answer request ``msg_id`` with ``error``; a message without a known id gets none
        (JSON-RPC would have ``null``, which no client can match to its request)."""
        if msg_id is not None:
            self.protocol._send_response(msg_id, None, error.to_response_error())

    def close(self, uri: str) -> None:
        self.open.discard(uri)
        task = self.debounces.pop(uri, None)
        if task is not None:
            task.cancel()
        for store in (self.analyses, self.latest, self.jobs, self._positions, self.pieces):
            store.pop(uri, None)


def is_pipe(uri: str) -> bool:
    """``.pipe`` files only: ``.py`` builder files are left to Python's own tools."""
    return uri.endswith(".pipe")


def _path_of(uri: str) -> str:
    from pygls.uris import to_fs_path

    return to_fs_path(uri) or uri


def to_lsp(diag: dg.Diagnostic, uri: str, positions: Positions) -> t.Diagnostic:
    span = diag.span
    rng = positions.range(span.start, span.end) if span is not None else positions.range(0, 0)
    message = diag.message + (f"\nhelp: {diag.help}" if diag.help else "")
    message += "".join(f"\nnote: {n}" for n in diag.notes)
    related = [t.DiagnosticRelatedInformation(
        location=t.Location(uri=uri, range=positions.range(lb.span.start, lb.span.end)),
        message=lb.message or diag.message) for lb in diag.labels[1:]]
    return t.Diagnostic(
        range=rng, message=message, code=diag.code, source="durapipe",
        severity=t.DiagnosticSeverity.Error if diag.is_error else t.DiagnosticSeverity.Warning,
        related_information=related or None)


server = DurapipeServer()


@server.feature(t.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: DurapipeServer, params: t.DidOpenTextDocumentParams) -> None:
    ls.open.add(params.text_document.uri)
    ls.schedule(params.text_document.uri, 0)


@server.feature(t.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: DurapipeServer, params: t.DidChangeTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri, DEBOUNCE_S)


@server.feature(t.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: DurapipeServer, params: t.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.close(uri)
    if is_pipe(uri):
        ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


_ITEM_KINDS = {
    "keyword": t.CompletionItemKind.Keyword, "block": t.CompletionItemKind.Module,
    "attribute": t.CompletionItemKind.Property, "value": t.CompletionItemKind.EnumMember,
    "gpu": t.CompletionItemKind.EnumMember, "stage": t.CompletionItemKind.Function,
    "param": t.CompletionItemKind.Variable, "output": t.CompletionItemKind.Field,
    "type": t.CompletionItemKind.TypeParameter,
}


@server.feature(t.TEXT_DOCUMENT_COMPLETION,
                t.CompletionOptions(trigger_characters=[".", '"', "[", " ", "{", "$"]))
def completion(ls: DurapipeServer, params: t.CompletionParams) -> t.CompletionList | None:
    uri = params.text_document.uri
    if not ls.handles(uri):
        return None
    # No waiting for the analysis: the context is read from the current text, names defined
    # elsewhere in the file from the latest finished analysis.
    text = ls.text(uri)
    if utf8_size(text) > MAX_SOURCE_BYTES:
        return t.CompletionList(is_incomplete=False, items=[])  # refused whole (P0003)
    offset = ls.positions(uri, text).offset(params.position)
    items = cp.complete(text, offset, ls.analyses.get(uri))
    return t.CompletionList(is_incomplete=False, items=[
        t.CompletionItem(
            label=item.label, kind=_ITEM_KINDS[item.kind], detail=item.detail or None,
            documentation=t.MarkupContent(kind=t.MarkupKind.Markdown,
                                          value=item.documentation.replace("``", "`"))
            if item.documentation else None,
            insert_text=item.insert)
        for item in items])


@server.feature(t.TEXT_DOCUMENT_HOVER)
async def hover(ls: DurapipeServer, params: t.HoverParams) -> t.Hover | None:
    uri = params.text_document.uri
    found = await ls.current(uri)
    if found is None:
        return None
    result, positions = found
    shown = an.hover(result, positions.offset(params.position))
    if shown is None:
        return None
    markdown, span = shown
    return t.Hover(contents=t.MarkupContent(kind=t.MarkupKind.Markdown, value=markdown),
                   range=positions.range(span.start, span.end) if span is not None else None)


async def _occurrence(ls: DurapipeServer, uri: str, position: t.Position,
                      ) -> tuple[an.Analysis, Positions, an.Occurrence] | None:
    found = await ls.current(uri)
    if found is None:
        return None
    result, positions = found
    occ = result.occurrence_at(positions.offset(position))
    return (result, positions, occ) if occ is not None else None


@server.feature(t.TEXT_DOCUMENT_DEFINITION)
async def definition(ls: DurapipeServer, params: t.DefinitionParams) -> list[t.Location] | None:
    found = await _occurrence(ls, params.text_document.uri, params.position)
    if found is None:
        return None
    result, positions, occ = found
    target = result.definitions.get(occ.symbol)
    if target is None:
        return None
    return [t.Location(uri=params.text_document.uri,
                       range=positions.range(target.start, target.end))]


@server.feature(t.TEXT_DOCUMENT_REFERENCES)
async def references(ls: DurapipeServer, params: t.ReferenceParams) -> list[t.Location] | None:
    found = await _occurrence(ls, params.text_document.uri, params.position)
    if found is None:
        return None
    result, positions, occ = found
    return [t.Location(uri=params.text_document.uri, range=positions.range(o.start, o.end))
            for o in result.references(occ.symbol, params.context.include_declaration)]


_SYMBOL_KINDS = {
    "pipeline": t.SymbolKind.Module, "stage": t.SymbolKind.Function,
    "params": t.SymbolKind.Namespace, "param": t.SymbolKind.Variable,
    "defaults": t.SymbolKind.Object, "block": t.SymbolKind.Struct,
    "attribute": t.SymbolKind.Property,
}


@server.feature(t.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
async def document_symbol(ls: DurapipeServer, params: t.DocumentSymbolParams,
                          ) -> list[t.DocumentSymbol] | None:
    uri = params.text_document.uri
    found = await ls.current(uri)
    if found is None:
        return None
    result, positions = found

    def convert(symbol: an.Symbol) -> t.DocumentSymbol:
        whole = positions.range(symbol.span.start, max(symbol.span.end, symbol.selection.end))
        chosen = positions.range(symbol.selection.start, symbol.selection.end)
        if not _contains(whole, chosen):
            whole = chosen
        return t.DocumentSymbol(name=symbol.name, detail=symbol.detail or None,
                                kind=_SYMBOL_KINDS[symbol.kind], range=whole,
                                selection_range=chosen,
                                children=[convert(c) for c in symbol.children] or None)

    return [convert(s) for s in an.symbols(result)]


def _contains(outer: t.Range, inner: t.Range) -> bool:
    def key(p: t.Position) -> tuple[int, int]:
        return (p.line, p.character)

    return key(outer.start) <= key(inner.start) and key(inner.end) <= key(outer.end)


@server.feature(t.TEXT_DOCUMENT_FORMATTING)
async def formatting(ls: DurapipeServer, params: t.DocumentFormattingParams,
                     ) -> list[t.TextEdit] | None:
    uri = params.text_document.uri
    if not ls.handles(uri):
        return None
    text = ls.text(uri)
    formatted = await asyncio.get_running_loop().run_in_executor(ls.worker, _format, text,
                                                                 _path_of(uri))
    if formatted is None or formatted == text:
        return [] if formatted == text else None
    positions = ls.positions(uri, text)
    return [t.TextEdit(range=positions.range(0, len(text)), new_text=formatted)]


def _format(text: str, path: str) -> str | None:
    from durapipe.dsl.fmt import FormatterError, format_source

    try:
        formatted, _ = format_source(text, path)
    except FormatterError:  # fmt refused to change meaning: leave the text as it is
        log.warning("durapipe fmt refused to format %s", path)
        return None
    return formatted


@server.feature(t.TEXT_DOCUMENT_CODE_ACTION,
                t.CodeActionOptions(code_action_kinds=[t.CodeActionKind.QuickFix]))
async def code_action(ls: DurapipeServer, params: t.CodeActionParams,
                      ) -> list[t.CodeAction] | None:
    uri = params.text_document.uri
    found = await ls.current(uri)
    if found is None:
        return None
    result, positions = found
    wanted = {(d.code, d.range.start.line, d.range.start.character): d
              for d in params.context.diagnostics if d.source == "durapipe"}
    lo, hi = positions.offset(params.range.start), positions.offset(params.range.end)
    actions: list[t.CodeAction] = []
    for diag in result.diagnostics:
        span = diag.span
        if span is None or span.end < lo or span.start > hi:
            continue
        start = positions.position(span.start)
        client = wanted.get((diag.code, start.line, start.character))
        for fix in fx.fixes(diag, result.text):
            actions.append(t.CodeAction(
                title=fix.title, kind=t.CodeActionKind.QuickFix,
                diagnostics=[client] if client else None, is_preferred=True,
                edit=t.WorkspaceEdit(changes={uri: [
                    t.TextEdit(range=positions.range(e.start, e.end), new_text=e.text)
                    for e in fix.edits]})))
    return actions


class _NoDeserializeTraceback(logging.Filter):
    """pygls logs a traceback for every message its types refuse; ``_receive`` logs one line
    and answers the request instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unable to deserialize message")


def main(argv: list[str] | None = None) -> int:
    del argv  # `--stdio` (what editors pass) is the only transport
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="durapipe lsp: %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pygls.protocol.json_rpc").addFilter(_NoDeserializeTraceback())
    server.start_io()
    return 0
