"""``durapipe fmt``: the canonical layout, idempotence, and that formatting never changes meaning.

Three kinds of test: exact output for hand-written inputs; round-trips over every ``.pipe`` file
in ``examples/`` and ``tests/cases/`` (globbed at test time) plus inline samples; and a
hypothesis property over random, valid, messily laid-out pipelines.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from durapipe.dsl import parser
from durapipe.dsl.fmt import MAX_WIDTH, format_source, is_formatted, syntax_shape
from durapipe.dsl.load import loads
from durapipe.dsl.source import Source, Span

REPO = Path(__file__).resolve().parents[2]


def fmt(text: str) -> str:
    out, diagnostics = format_source(text, "test.pipe")
    assert out is not None, [d.message for d in diagnostics]
    return out


def src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def assert_round_trip(text: str, path: str = "test.pipe") -> str:
    """fmt(x) is a fixed point and means what x means (model, diagnostics, syntax, comments)."""
    out, diagnostics = format_source(text, path)
    assert out is not None, [d.message for d in diagnostics]
    again, _ = format_source(out, path)
    assert again == out, "fmt is not idempotent"
    before, after = loads(text, path), loads(out, path)
    assert after.pipeline == before.pipeline
    assert [d.code for d in after.diagnostics] == [d.code for d in before.diagnostics]
    assert [d.message for d in after.diagnostics] == [d.message for d in before.diagnostics]
    old_tree, _ = parser.parse(Source(path, text))
    new_tree, _ = parser.parse(Source(path, out))
    assert old_tree is not None and new_tree is not None
    assert syntax_shape(new_tree) == syntax_shape(old_tree)
    return out


# -- exact layouts ----------------------------------------------------------------------------


def test_alignment_runs_blank_lines_and_top_level_spacing() -> None:
    text = src('''
        pipeline   "p"   {  namespace="ml"
          storage = "s3://b"
            service_account="sa"



          kind = "Workflow"
          labels { team = "ml" }
          timezone = "UTC"
        }
        stage "a" {
        image = "i"  command=["x"]
        }
        params {
          epochs: int = 3
          learning_rate: float = 2e-5
          name: str
        }
        ''')
    assert fmt(text) == src('''
        pipeline "p" {
          namespace       = "ml"
          storage         = "s3://b"
          service_account = "sa"

          kind = "Workflow"
          labels { team = "ml" }
          timezone = "UTC"
        }

        stage "a" {
          image   = "i"
          command = ["x"]
        }

        params {
          epochs: int          = 3
          learning_rate: float = 2e-5
          name: str
        }
        ''')


def test_comments_are_kept_in_place() -> None:
    text = src('''
        // file header
        # second line

        pipeline "p" { # opening
          namespace = "ml" # the namespace
          storage = "s3://b"   // where things go

          # before kind
          kind = "Workflow"
          # end of pipeline
        }
        # between blocks
        stage "a" {
          command = [ # why
            "x", # first
            # before y
            "y"
            # end of list
          ]
          image = "i"
        } # after the stage
        # end of file
        ''')
    assert fmt(text) == src('''
        # file header
        # second line

        pipeline "p" {  # opening
          namespace = "ml"      # the namespace
          storage   = "s3://b"  # where things go

          # before kind
          kind = "Workflow"
          # end of pipeline
        }

        # between blocks
        stage "a" {
          command = [  # why
            "x",  # first
            # before y
            "y",
            # end of list
          ]
          image   = "i"
        }  # after the stage
        # end of file
        ''')


def test_comments_in_odd_places_move_before_their_member() -> None:
    text = src('''
        pipeline "p" # after the label
        {
          namespace # after the key
            = "ml"
          labels { a = secret # after the name
            ("s", "k") }
        }
        ''')
    assert fmt(text) == src('''
        # after the label
        pipeline "p" {
          # after the key
          namespace = "ml"
          labels {
            # after the name
            a = secret("s", "k")
          }
        }
        ''')


def test_one_line_blocks_stay_only_when_short_flat_and_already_one_line() -> None:
    text = src('''
        stage "a" {
          resources { cpu = 8  memory = 32Gi }
          retry { attempts = 5  on_oom { memory = [256Gi, 512Gi] } }
          cache {
            max_age = 7d
          }
          env { A = "x" B = secret("s", "k") }
          labels { a = "%s" }
          checkpoint {}
        }
        ''' % ("x" * 90))
    assert fmt(text) == src('''
        stage "a" {
          resources { cpu = 8  memory = 32Gi }
          retry {
            attempts = 5
            on_oom { memory = [256Gi, 512Gi] }
          }
          cache {
            max_age = 7d
          }
          env { A = "x"  B = secret("s", "k") }
          labels {
            a = "%s"
          }
          checkpoint {}
        }
        ''' % ("x" * 90))


def test_long_lists_break_one_item_per_line_with_trailing_comma() -> None:
    items = ", ".join(f'"argument-{i}"' for i in range(12))
    text = f'stage "a" {{\n  command = [{items}]\n  args = [[1, 2], [3]]\n}}\n'
    out = fmt(text)
    assert out == src('''
        stage "a" {
          command = [
            "argument-0",
            "argument-1",
            "argument-2",
            "argument-3",
            "argument-4",
            "argument-5",
            "argument-6",
            "argument-7",
            "argument-8",
            "argument-9",
            "argument-10",
            "argument-11",
          ]
          args    = [[1, 2], [3]]
        }
        ''')
    # A list that fits is joined back onto one line, trailing comma dropped.
    assert fmt('stage "a" {\n  needs = [\n    a,\n    b,\n  ]\n}\n') == \
        'stage "a" {\n  needs = [a, b]\n}\n'


def test_the_fit_limit_is_exactly_max_width_columns() -> None:
    def line_for(width: int) -> str:
        # `  command = ["x..."]` is width characters long.
        return '  command = ["' + "x" * (width - 16) + '"]'

    fits, too_long = line_for(MAX_WIDTH), line_for(MAX_WIDTH + 1)
    assert len(fits) == MAX_WIDTH
    assert fmt(f'stage "a" {{\n{fits}\n}}\n') == f'stage "a" {{\n{fits}\n}}\n'
    assert fmt(f'stage "a" {{\n{too_long}\n}}\n').splitlines()[1] == "  command = ["


def test_heredocs_are_indented_with_their_block() -> None:
    text = (
        'stage "a" {\n'
        'script = <<EOT\n'
        'python train.py \\\n'
        '  --lr ${params.lr}\n'
        '\n'
        'echo "done"   \n'
        'EOT\n'
        'args = [<<-PY\n'
        '        print(1)\n'
        '        PY, "x"]\n'
        '  raw = <<EOT\n'
        '    all lines indented\n'
        '      keep it verbatim\n'
        'EOT\n'
        '}\n'
    )
    assert fmt(text) == (
        'stage "a" {\n'
        '  script = <<-EOT\n'
        '    python train.py \\\n'
        '      --lr ${params.lr}\n'
        '\n'
        '    echo "done"   \n'
        '    EOT\n'
        '  args   = [\n'
        '    <<-PY\n'
        '      print(1)\n'
        '      PY,\n'
        '    "x",\n'
        '  ]\n'
        '  raw    = <<EOT\n'
        '    all lines indented\n'
        '      keep it verbatim\n'
        '    EOT\n'
        '}\n'
    )


def test_quoted_keys_are_unquoted_only_when_they_are_plain_names() -> None:
    text = src('''
        pipeline "p" {
          labels {
            "team" = "ml"
            "app.kubernetes.io/name" = "x"
            "true" = "t"
            "params" = "p"
            "with space" = "s"
            "a-b_c" = "d"
          }
        }
        ''')
    assert fmt(text) == src('''
        pipeline "p" {
          labels {
            team                     = "ml"
            "app.kubernetes.io/name" = "x"
            "true"                   = "t"
            "params"                 = "p"
            "with space"             = "s"
            a-b_c                    = "d"
          }
        }
        ''')


def test_strings_are_re_escaped_canonically() -> None:
    text = (
        'pipeline "p" {\n'
        '  a = "tab\\there \\"q\\" back\\\\slash \\u00e9 \\u0001 \\r"\n'
        '  b = "${ params.x }-$${literal}-\\u0024${params.y}"\n'
        '  c = "é ✓"\n'
        '}\n'
    )
    assert fmt(text) == (
        'pipeline "p" {\n'
        '  a = "tab\\there \\"q\\" back\\\\slash é \\u0001 \\r"\n'
        '  b = "${params.x}-$${literal}-\\u0024${params.y}"\n'
        '  c = "é ✓"\n'
        '}\n'
    )


def test_numbers_units_and_references_are_written_as_they_were() -> None:
    text = 'params { lr: float = 2E-05  n: int = -3 }\nstage "a" { memory = 1.5Gi  x = a . b }\n'
    assert fmt(text) == src('''
        params {
          lr: float = 2E-05
          n: int    = -3
        }

        stage "a" {
          memory = 1.5Gi
          x      = a.b
        }
        ''')


def test_empty_and_comment_only_files() -> None:
    assert fmt("") == ""
    assert fmt("  \n\n") == ""
    assert fmt("// only\n\n\n# comments") == "# only\n\n# comments\n"
    assert fmt('defaults{}') == "defaults {}\n"
    assert fmt('defaults{\n# nothing yet\n}') == "defaults {\n  # nothing yet\n}\n"


def test_broken_files_are_never_formatted() -> None:
    for text in ['stage "a" { image: "x" }', 'stage "a" {', "stage 'a' {}",
                 'stage "a" { x = "${1+1}" }', "pipeline \"p\" { a = 1, b = 2 }"]:
        out, diagnostics = format_source(text, "bad.pipe")
        assert out is None
        assert diagnostics and all(d.code.startswith("P01") for d in diagnostics)
    assert is_formatted("stage 'a' {}") is None


def test_semantic_errors_do_not_stop_formatting() -> None:
    out, diagnostics = format_source('stage "a" { imagee = "x" }', "x.pipe")
    assert out == 'stage "a" {\n  imagee = "x"\n}\n'
    assert diagnostics == []
    assert is_formatted(out) is True


# -- round trips over the corpus ----------------------------------------------------------------

INLINE_SAMPLES = {
    "t1": src('''
        pipeline "llm-finetune" {
          namespace = "ml"
          storage   = "s3://acme/durapipe"
          profile   = "gke"
        }

        params {
          epochs: int = 3
          lr: float = 2e-5
        }

        defaults {
          image = "ghcr.io/acme/llm:1"
          interruptible = true
          retry { attempts = 2  backoff = 30s }
          env { WANDB_PROJECT = "x"  HF_TOKEN = secret("hf", "token") }
        }

        stage "prep" {
          command = ["python", "-m", "prep", "--out", "/out/data"]
          resources { cpu = 8  memory = 32Gi }
          outputs { data = "/out/data" }
          cache { max_age = 7d }
        }

        stage "train" {
          command = ["torchrun", "train.py", "--data", prep.outputs.data, "--epochs=${params.epochs}", \
"--lr", params.lr]
          resources {
            gpu { count = 8  types = ["H100", "A100-80GB:16"]  fallback_after = 30m }
          }
          retry { attempts = 5  on_oom { memory = [256Gi, 512Gi, 1Ti] } }
          checkpoint { keep = 2 }
        }
        stage "eval" {
          needs = [train]
          interruptible = false
          script = <<-EOT
            python eval.py
            echo ${HOME}
            EOT
        }
        '''),
    "crlf": 'pipeline "p" {\r\n  namespace = "ml" # c\r\n  x = <<EOT\r\nline\r\nEOT\r\n}\r\n',
    "messy": 'pipeline "p"{namespace="ml"storage="s3://x"}stage "a"{image="i"command=["a",]'
             'needs=[]cache=true}',
    "tabs_and_odd_heredocs": 'stage "a" {\n\tscript = <<-EOT\n\t\techo a\n\n\t\t  b\n\t\tEOT\n'
                             '  x = <<EOT\n  \n\t\nEOT\n  y = <<EOT\nEOT\n}\n',
}


def corpus() -> list[tuple[str, str]]:
    files = sorted(REPO.glob("examples/**/*.pipe")) + sorted(REPO.glob("tests/cases/**/*.pipe"))
    out = [(f"inline:{name}", text) for name, text in INLINE_SAMPLES.items()]
    for path in files:
        if not path.is_file():
            continue
        try:
            out.append((str(path.relative_to(REPO)), path.read_text("utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return out


@pytest.mark.parametrize(("name", "text"), corpus(), ids=[name for name, _ in corpus()])
def test_round_trip(name: str, text: str) -> None:
    out, diagnostics = format_source(text, name)
    if out is None:
        assert any(d.code.startswith("P0") for d in diagnostics)
        return
    assert_round_trip(text, name)


def test_formatted_output_respects_the_basics() -> None:
    out = assert_round_trip(INLINE_SAMPLES["t1"])
    assert out.endswith("}\n") and "\n\n\n" not in out
    assert all(not line.endswith(" ") for line in out.splitlines())
    assert all(len(line) <= MAX_WIDTH for line in out.splitlines())


# -- property: random valid pipelines, laid out at random ----------------------------------------

NAMES = ["image", "command", "args", "cpu", "memory", "count", "types", "attempts", "x", "a-b",
         "_k", "team", "data", "keep", "max_age", "namespace"]
BLOCK_NAMES = ["resources", "retry", "gpu", "env", "labels", "cache", "outputs", "on_oom", "y"]
QUOTED_KEYS = ['"team"', '"app.kubernetes.io/name"', '"true"', '"params"', '"a b"',
               '"q\\"k"', '"$${x}"', '"a${params.lr}b"', '"stage"']
STRING_PIECES = ["a", "Z", " ", "é", "✓", "\\n", "\\t", "\\r", '\\"', "\\\\", "\\u00e9",
                 "\\u0001", "\\u0024", "$${", "${params.lr}", "${ a.b }", "$", "}", "#",
                 "//", "'", "x" * 30]
HEREDOC_LINES = ["echo ${HOME}", "  indented", "\tTAB", "", "   ", "# not a comment",
                 'x = "y"', "{ [ (", "EOTX", "python -m x"]


def _sep(draw: hs.DrawFn, tight: bool) -> str:
    """Whitespace or comments between two tokens; ``tight`` allows nothing at all."""
    choices = [" ", "\n", "\n\n\n  ", " # a comment\n", "\n  // slashes \n", "\t", "\n\n# own\n"]
    if tight:
        choices.append("")
    return draw(hs.sampled_from(choices))


@hs.composite
def heredoc(draw: hs.DrawFn) -> str:
    tag = draw(hs.sampled_from(["EOT", "SH", "PY"]))
    lines = draw(hs.lists(hs.sampled_from(HEREDOC_LINES), max_size=4))
    indent = draw(hs.sampled_from(["", "  ", "\t"]))
    dash = draw(hs.booleans())
    body = "".join(indent + line + "\n" for line in lines)
    return f"<<{'-' if dash else ''}{tag}\n{body}{indent if dash else ''}{tag}"


@hs.composite
def value(draw: hs.DrawFn, depth: int = 0) -> list[str]:
    kinds = ["str", "num", "unit", "bool", "ref", "call", "heredoc"]
    if depth < 2:
        kinds += ["list", "list"]
    kind = draw(hs.sampled_from(kinds))
    if kind == "str":
        return ['"' + "".join(draw(hs.lists(hs.sampled_from(STRING_PIECES), max_size=6))) + '"']
    if kind == "num":
        return [draw(hs.sampled_from(["0", "3", "-3", "2e-5", "1.5", "2E+3", "10"]))]
    if kind == "unit":
        return [draw(hs.sampled_from(["30m", "256Gi", "1.5Gi", "12h", "7d", "500Mi"]))]
    if kind == "bool":
        return [draw(hs.sampled_from(["true", "false"]))]
    if kind == "ref":
        ref = draw(hs.sampled_from(["train", "params.lr", "prep.outputs.data", "a.b-c"]))
        if "." in ref and draw(hs.booleans()):
            head, _, tail = ref.partition(".")
            return [head, ".", tail]  # laid out (and commented) like any other tokens
        return [ref]
    if kind == "heredoc":
        return [draw(heredoc())]
    if kind == "call":
        args = draw(hs.lists(hs.sampled_from(['"s"', '"k"', "1", "x"]), max_size=3))
        return ["secret", "(", *_commas([[a] for a in args], draw(hs.booleans())), ")"]
    items = draw(hs.lists(value(depth + 1), max_size=6))
    return ["[", *_commas(items, draw(hs.booleans())), "]"]


def _commas(items: list[list[str]], trailing: bool) -> list[str]:
    out: list[str] = []
    for i, item in enumerate(items):
        if i:
            out.append(",")
        out.extend(item)
    if items and trailing:
        out.append(",")
    return out


@hs.composite
def key(draw: hs.DrawFn, names: list[str]) -> str:
    if draw(hs.integers(0, 5)) == 0:
        return draw(hs.sampled_from(QUOTED_KEYS))
    return draw(hs.sampled_from(names))


@hs.composite
def members(draw: hs.DrawFn, depth: int = 0) -> list[str]:
    out: list[str] = []
    for _ in range(draw(hs.integers(0, 5))):
        if depth < 2 and draw(hs.integers(0, 3)) == 0:
            out += [draw(key(BLOCK_NAMES)), "{", *draw(members(depth + 1)), "}"]
        else:
            out += [draw(key(NAMES)), "=", *draw(value())]
    return out


@hs.composite
def pipeline_tokens(draw: hs.DrawFn) -> list[str]:
    tokens: list[str] = []
    for _ in range(draw(hs.integers(0, 4))):
        kind = draw(hs.sampled_from(["pipeline", "stage", "stage", "defaults", "params"]))
        if kind == "params":
            tokens += ["params", "{"]
            for _ in range(draw(hs.integers(0, 3))):
                tokens += [draw(hs.sampled_from(["lr", "epochs", "n"])), ":",
                           draw(hs.sampled_from(["int", "float", "str", "bool"]))]
                if draw(hs.booleans()):
                    tokens += ["=", *draw(value())]
            tokens.append("}")
            continue
        tokens.append(kind)
        if kind != "defaults":
            tokens.append(draw(hs.sampled_from(['"p"', '"train"', '"prep"', '"s-${params.lr}"'])))
        tokens += ["{", *draw(members()), "}"]
    return tokens


_PUNCT = set("{}[](),=:.")


@hs.composite
def pipeline_text(draw: hs.DrawFn) -> str:
    tokens = draw(pipeline_tokens())
    out = [draw(hs.sampled_from(["", "# leading\n", "\n\n"]))]
    for i, token in enumerate(tokens):
        if i:
            tight = tokens[i - 1][-1] in _PUNCT or token[0] in _PUNCT
            out.append(_sep(draw, tight))
        out.append(token)
    out.append(draw(hs.sampled_from(["", "\n", "\n# trailing", " // end\n\n"])))
    return "".join(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipeline_text())
def test_property_fmt_is_idempotent_and_keeps_meaning(text: str) -> None:
    syntax, diagnostics = parser.parse(Source("gen.pipe", text))
    assert syntax is not None and not diagnostics, (text, [d.message for d in diagnostics])
    assert_round_trip(text, "gen.pipe")


@settings(max_examples=100, deadline=None)
@given(hs.lists(hs.sampled_from(["a", "x-y", "$", "${", "}", "\\", '"', "\n", "\t", "\x7f",
                                 "\u2028", "é", "\U0001f600", "\ud800"]), max_size=8),
       hs.booleans())
def test_property_any_string_round_trips(pieces: list[str], with_ref: bool) -> None:
    from durapipe.dsl import syntax as st
    from durapipe.dsl.fmt import render_string

    parts: list[str | st.RefValue] = ["".join(pieces)]
    if with_ref:
        anywhere = Span(Source("s", ""), 0, 0)  # spans are not compared
        parts.append(st.RefValue(anywhere, ("params", "lr")))
        parts.append("".join(reversed(pieces)))
    literal = render_string(parts)
    tree, diagnostics = parser.parse(Source("s", f'pipeline "p" {{ a = {literal} }}'))
    assert tree is not None and not diagnostics, literal
    block = tree.items[0]
    assert isinstance(block, st.Block)
    attribute = block.members[0]
    assert isinstance(attribute, st.Attribute) and isinstance(attribute.value, st.StrValue)
    got = [p if isinstance(p, str) else p.path for p in attribute.value.parts if p != ""]
    want = [p if isinstance(p, str) else p.path for p in parts if p != ""]
    assert got == want
