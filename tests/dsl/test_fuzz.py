"""No input, however malformed, makes the front end raise or hang.

Thousands of inputs go through ``loads``/``load_path`` and every diagnostic is rendered in all
three formats: mutations of the valid examples and of the error cases (characters and tokens
deleted, duplicated, swapped, replaced; bytes, punctuation and keywords inserted), random bytes,
random text, grammar-flavoured random text, and extreme inputs (deep nesting, 20 MiB, very long
lines).  Each input runs under a wall-clock alarm, so a hang fails the test instead of stalling
it; the alarm is a bound for "does it terminate", not a speed target.

Hypothesis runs derandomized (the same examples on every run) with no example database, so CI
is reproducible; the seeded ``random`` loops add volume cheaply.
"""

from __future__ import annotations

import json
import random
import re
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durapipe.dsl import LoadResult, load_path, loads
from durapipe.dsl.codes import CODES
from durapipe.dsl.diagnostics import Diagnostic, has_errors, render
from durapipe.dsl.source import MAX_SOURCE_BYTES

REPO_ROOT = Path(__file__).resolve().parents[2]
CASES = REPO_ROOT / "tests" / "cases"

#: Seconds one input may take before it counts as a hang.
ALARM_S = 10

SEED_FILES = sorted(
    p for p in [*(REPO_ROOT / "examples").glob("**/*.pipe"), *CASES.glob("*/*.pipe")]
    if p.is_file()
)
SEED_BYTES = [p.read_bytes() for p in SEED_FILES]
SEED_TEXTS = [b.decode("utf-8", errors="replace") for b in SEED_BYTES]

#: Fragments worth inserting: every keyword and punctuation mark of the language, the error
#: tokens the parser repairs, interpolation and heredoc openers, and awkward characters.
FRAGMENTS = [
    "pipeline", "stage", "params", "defaults", "true", "false", "secret", "secret(", "needs",
    "outputs", "resources", "gpu", "retry", "on_oom", "cache", "checkpoint", "distributed",
    "env", "image", "command", "script", "params.", ".outputs.", "{", "}", "[", "]", "(", ")",
    "=", ":", ",", ".", '"', "'", "#", "//", "\n", " ", "\t", "\r", "\r\n", ";", "@", "\\",
    "${", "$${", "}}", "{{", "<<EOT\n", "<<-EOT\n", "EOT\n", "<<", "-", "-1", "0", "1e309",
    "256Gi", "30m", "1h30m", "99999999999999999999999", "0.5", "\x00", "\x07", "\ufeff",
    "\u202e", "\u00e9", "\U0001f600", "\ud800", "\u2028", '"x"', "'x'", 'stage "s" {',
    'pipeline "p" {}', "params { a: int = 1 }", "defaults {",
]
PUNCTUATION = "{}[]()=:,.\"'#/<>\\$;@!%^&*-+|~`?"

_TOKEN_RE = re.compile(r'"(?:[^"\\\n]|\\.)*"?|[A-Za-z_][A-Za-z0-9_-]*|\d[\w.]*|\s+|.', re.DOTALL)


def tokenize(text: str) -> list[str]:
    return _TOKEN_RE.findall(text)


def mutate(rng: random.Random, text: str, rounds: int) -> str:
    """Apply ``rounds`` random edits to ``text``, at character or token level."""
    tokens = tokenize(text) or [""]
    for _ in range(rounds):
        i = rng.randrange(len(tokens))
        j = rng.randrange(len(tokens))
        op = rng.randrange(12)
        if op == 0 and len(tokens) > 1:      # delete a token
            del tokens[i]
        elif op == 1:                        # duplicate a token
            tokens.insert(i, tokens[i])
        elif op == 2:                        # swap two tokens
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif op == 3:                        # replace a token by another one of the file
            tokens[i] = tokens[j]
        elif op == 4:                        # insert a fragment
            tokens.insert(i, rng.choice(FRAGMENTS))
        elif op == 5:                        # insert punctuation
            tokens.insert(i, rng.choice(PUNCTUATION))
        elif op == 6:                        # insert random code points
            tokens.insert(i, "".join(chr(rng.randrange(0x110000))
                                     for _ in range(rng.randint(1, 4))))
        elif op == 7:                        # delete a character inside a token
            tok = tokens[i]
            if tok:
                k = rng.randrange(len(tok))
                tokens[i] = tok[:k] + tok[k + 1:]
        elif op == 8:                        # duplicate a character inside a token
            tok = tokens[i]
            if tok:
                k = rng.randrange(len(tok))
                tokens[i] = tok[:k] + tok[k] + tok[k:]
        elif op == 9:                        # swap two adjacent characters of the file
            flat = "".join(tokens)
            if len(flat) > 1:
                k = rng.randrange(len(flat) - 1)
                flat = flat[:k] + flat[k + 1] + flat[k] + flat[k + 2:]
                tokens = tokenize(flat) or [""]
        elif op == 10:                       # cut the file short
            tokens = tokens[:i] or [""]
        else:                                # move a slice of tokens elsewhere
            lo, hi = sorted((i, j))
            chunk = tokens[lo:hi + 1]
            del tokens[lo:hi + 1]
            k = rng.randrange(len(tokens) + 1)
            tokens[k:k] = chunk
            tokens = tokens or [""]
    return "".join(tokens)


class Hang(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` swallows it."""


@contextmanager
def hang_guard(seconds: float = ALARM_S) -> Iterator[None]:
    if not hasattr(signal, "setitimer") \
            or threading.current_thread() is not threading.main_thread():
        yield  # pragma: no cover - no SIGALRM here; the test still checks for tracebacks
        return

    def on_alarm(signum: int, frame: object) -> None:
        raise Hang(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def assert_sane(result: LoadResult, text_length: int | None) -> None:
    """A result, never an exception: coded diagnostics with spans inside the input, that
    render in every format; an absent pipeline always comes with an error."""
    assert isinstance(result, LoadResult)
    for diag in result.diagnostics:
        assert isinstance(diag, Diagnostic)
        assert diag.code in CODES
        assert diag.message
        for label in diag.labels:
            span = label.span
            assert 0 <= span.start <= span.end
            if text_length is not None:
                assert span.end <= text_length
    if result.pipeline is None:
        assert has_errors(result.diagnostics), "no pipeline and no error"
    if result.ok:
        assert not has_errors(result.diagnostics)
    human = render(result.diagnostics, "human")
    short = render(result.diagnostics, "short")
    records = json.loads(render(result.diagnostics, "json"))
    assert isinstance(human, str) and isinstance(short, str)
    assert len(records) == len(result.diagnostics)
    assert [r["code"] for r in records] == [d.code for d in result.diagnostics]


def check_text(text: str, seconds: float = ALARM_S) -> LoadResult:
    with hang_guard(seconds):
        result = loads(text, "fuzz.pipe")
        assert_sane(result, len(text))
    return result


def check_bytes(data: bytes, directory: Path, seconds: float = ALARM_S) -> LoadResult:
    path = directory / "fuzz.pipe"
    path.write_bytes(data)
    with hang_guard(seconds):
        result = load_path(path)
        assert_sane(result, None)
    return result


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


_FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz(examples: int) -> settings:
    return settings(_FUZZ, max_examples=examples)


def test_the_seed_corpus_is_there() -> None:
    names = {p.name for p in SEED_FILES}
    assert "llm.pipe" in names and len(SEED_FILES) >= 10
    assert not has_errors(loads((CASES / "valid" / "llm.pipe").read_text()).diagnostics)


# -- (a) mutations of real files --------------------------------------------------------------


@fuzz(1500)
@given(seed=st.sampled_from(SEED_TEXTS), rng=st.randoms(use_true_random=False),
       rounds=st.integers(1, 8))
def test_mutated_files_never_raise(seed: str, rng: random.Random, rounds: int) -> None:
    check_text(mutate(rng, seed, rounds))


def test_seeded_mutations_never_raise() -> None:
    rng = random.Random(20261129)
    for n in range(4000):
        seed = SEED_TEXTS[n % len(SEED_TEXTS)]
        check_text(mutate(rng, seed, rng.randint(1, 12)))


@fuzz(300)
@given(seed=st.sampled_from(SEED_BYTES), data=st.data())
def test_byte_mutations_through_files_never_raise(seed: bytes, data: st.DataObject,
                                                  scratch: Path) -> None:
    blob = bytearray(seed)
    for _ in range(data.draw(st.integers(1, 6), label="edits")):
        at = data.draw(st.integers(0, len(blob)), label="at")
        if data.draw(st.booleans(), label="insert"):
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
        else:
            del blob[at:at + data.draw(st.integers(1, 8), label="length")]
    check_bytes(bytes(blob), scratch)


def test_single_token_mistakes_rarely_cascade() -> None:
    """One mistake, one diagnostic: after one token of a valid file is deleted, doubled,
    truncated or preceded by punctuation, more than two errors are the exception.  (Some
    cascades are unavoidable without guessing, e.g. a `{` deleted after a block's name.)"""
    valid = [t for p, t in zip(SEED_FILES, SEED_TEXTS)
             if "errors" not in p.parts and "multiple" not in p.parts]
    rng = random.Random(11)
    runs, cascades = 1500, []
    for n in range(runs):
        seed = valid[n % len(valid)]
        tokens = tokenize(seed)
        i = rng.choice([k for k, t in enumerate(tokens) if t.strip() and t[0] != "#"])
        op = rng.randrange(4)
        if op == 0:
            del tokens[i]
        elif op == 1:
            tokens.insert(i, tokens[i])
        elif op == 2:
            tokens.insert(i, rng.choice(PUNCTUATION))
        else:
            tokens[i] = tokens[i][:-1] if len(tokens[i]) > 1 else "x"
        result = check_text("".join(tokens))
        errors = [d for d in result.diagnostics if d.is_error]
        if len(errors) > 2:
            cascades.append(render(errors, "short"))
    assert len(cascades) <= runs * 0.03, "\n\n".join(cascades[:10])


# -- (b) random input -------------------------------------------------------------------------

_GRAMMARISH = st.one_of(
    st.sampled_from(FRAGMENTS), st.sampled_from(list(PUNCTUATION)),
    st.from_regex(r"[a-z_][a-z0-9_-]{0,8}", fullmatch=True),
    st.from_regex(r"-?\d{1,4}(\.\d{1,3})?([eE]-?\d)?(Gi|Mi|m|s|h|d)?", fullmatch=True),
)


@fuzz(500)
@given(text=st.lists(_GRAMMARISH, max_size=80).map(" ".join))
def test_grammar_flavoured_noise_never_raises(text: str) -> None:
    check_text(text)


@fuzz(400)
@given(text=st.text(max_size=2000))
def test_random_text_never_raises(text: str) -> None:
    check_text(text)


@fuzz(300)
@given(blob=st.binary(max_size=2000))
def test_random_bytes_never_raise(blob: bytes, scratch: Path) -> None:
    check_bytes(blob, scratch)


def test_seeded_random_bytes_and_text_never_raise(scratch: Path) -> None:
    rng = random.Random(7)
    for n in range(300):
        blob = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000)))
        check_bytes(blob, scratch)
        alphabet = PUNCTUATION + "abcdefgstageparams0123456789 \n\t\"'"
        check_text("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 3000))))


# -- (c) extreme inputs -----------------------------------------------------------------------

_STAGE = 'stage "s{i}" {{ image = "x" command = ["a"] }}\n'


def _extremes() -> dict[str, Callable[[], str]]:
    deep = 10_000
    return {
        "braces": lambda: "{" * deep,
        "brackets": lambda: "[" * deep,
        "parens": lambda: "(" * deep,
        "closers": lambda: "}])" * deep,
        "nested-blocks": lambda: 'stage "a" ' + "x {" * deep + "}" * deep,
        "nested-lists": lambda: 'pipeline "p" {}\nstage "s" { image = "x" command = '
                                + "[" * deep + "]" * deep + " }",
        "nested-calls": lambda: 'stage "s" { env { A = ' + "secret(" * deep + ")" * deep + " } }",
        "nested-just-allowed": lambda: 'pipeline "p" {}\nstage "s" { image = "x" command = '
                                       + "[" * 63 + "]" * 63 + " }",
        "long-dotted-reference": lambda: 'pipeline "p" {}\nstage "s" { image = "x" command = ['
                                         + ".".join(["a"] * 100_000) + "] }",
        "long-interpolation": lambda: 'pipeline "p" {}\nstage "s" { image = "x" command = ["'
                                      + "${params.x}" * 20_000 + '"] }',
        "long-list-line": lambda: 'pipeline "p" {}\nstage "s" { image = "x" command = ['
                                  + ", ".join(['"a"'] * 50_000) + "] }",
        "long-string": lambda: 'pipeline "p" {}\nstage "s" { image = "' + "x" * 4_000_000
                               + '" command = ["a"] }',
        "long-name": lambda: "x" * 4_000_000,
        "long-comment": lambda: "#" + "x" * (MAX_SOURCE_BYTES - 1),
        "long-unterminated-heredoc": lambda: 'stage "s" { script = <<EOT\n' + "echo\n" * 500_000,
        "many-heredoc-openers": lambda: "<<EOT\n" * 100_000,
        "many-unterminated-strings": lambda: '"x\n' * 100_000,
        "junk-semicolons": lambda: ";" * (MAX_SOURCE_BYTES - 1),
        "junk-closing-braces": lambda: "}" * (MAX_SOURCE_BYTES - 1),
        "junk-names": lambda: "a " * (MAX_SOURCE_BYTES // 2 - 1),
        "junk-lines": lambda: "= ]\n" * (MAX_SOURCE_BYTES // 4 - 1),
        "control-characters": lambda: "".join(chr(c) for c in range(1, 32)) * 10_000,
        "many-stages": lambda: 'pipeline "p" {}\n' + "".join(_STAGE.format(i=i)
                                                            for i in range(5_000)),
        "dependency-chain": lambda: 'pipeline "p" {}\n' + "".join(
            f'stage "s{i}" {{ image = "x" command = ["a"] needs = [s{i + 1}] }}\n'
            for i in range(3_000)) + 'stage "s3000" { image = "x" command = ["a"] needs = [s0] }',
        "many-errors": lambda: 'pipeline "p" {}\n' + 'stage "s" { image: 1, x = \'y\' ; }\n'
                               * 20_000,
        "crlf-and-bom": lambda: "\ufeff" + (CASES / "valid" / "llm.pipe").read_text()
                                .replace("\n", "\r\n"),
        "lone-cr": lambda: (CASES / "valid" / "llm.pipe").read_text().replace("\n", "\r"),
        "tabs": lambda: (CASES / "valid" / "llm.pipe").read_text().replace("  ", "\t\t\t"),
    }


EXTREMES = _extremes()


@pytest.mark.parametrize("name", sorted(EXTREMES))
def test_extreme_input(name: str) -> None:
    text = EXTREMES[name]()
    assert len(text) <= MAX_SOURCE_BYTES
    check_text(text)


def test_twenty_mebibyte_file_is_refused(scratch: Path) -> None:
    size = 20 * 1024 * 1024
    result = check_bytes(b'pipeline "p" {}\n' + b"# padding\n" * (size // 10), scratch)
    assert [d.code for d in result.diagnostics] == ["P0003"]
    result = check_text("x" * size)
    assert [d.code for d in result.diagnostics] == ["P0003"]


def test_deep_nesting_is_refused() -> None:
    for opener in "{[(":
        result = check_text('pipeline "p" {}\nstage "s" ' + opener * 10_000)
        assert [d.code for d in result.diagnostics] == ["P0003"]


def test_binary_junk_is_refused(scratch: Path) -> None:
    result = check_bytes(bytes(range(256)) * 64, scratch)
    assert [d.code for d in result.diagnostics] == ["P0002"]
    result = check_text('pipeline "p" {}\x00\x01\x02')
    assert [d.code for d in result.diagnostics] == ["P0002"]
