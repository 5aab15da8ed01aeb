"""The one registry of diagnostic codes.

A code is stable once published: it is never reused for another meaning.  ``P01xx`` syntax,
``P02xx`` schema, ``P03xx`` semantics, ``P04xx`` compilation to Argo, ``P00xx`` input files,
``W0xxx`` warnings.  ``durapipe explain CODE`` prints the explanation; a test checks that every
code has one and is exercised by a file under ``tests/cases/``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    code: str
    title: str
    explanation: str


_CODES = [
    # -- input files ----------------------------------------------------------------------
    Code("P0001", "cannot read the input file", """
The file does not exist, is a directory, or cannot be read.  Check the path you passed."""),
    Code("P0002", "the input is not UTF-8 text", """
A `.pipe` file is UTF-8 text.  This one holds bytes that are not valid UTF-8 (or NUL bytes),
which usually means a binary file was passed by mistake."""),
    Code("P0003", "the input is too large or nested too deeply", """
durapipe refuses a `.pipe` input over 4 MiB (4,194,304 bytes of UTF-8) before parsing it, in
`check`, `compile`, `fmt`, `run`, `graph` and the language server alike, and blocks or lists
nested more than 64 levels deep, so a malformed or generated file cannot exhaust memory, the
stack or minutes of time.  No pipeline that fits Argo's limits comes near 4 MiB (10,000
generated stages are 2 MB): split it into several pipelines."""),
    Code("P0004", "the Python builder module is invalid", """
`durapipe` loads a `.py` file as a module and expects a module-level variable `pipeline` built
with `durapipe.dsl.builder.Pipeline`.  The module raised an exception, or `pipeline` is missing
or of the wrong type."""),
    # -- syntax ---------------------------------------------------------------------------
    Code("P0100", "syntax error", """
The parser met a token it did not expect.  The message lists what it expected there.

    stage "train" {
      image = "ghcr.io/acme/train:1"
      ]"""),
    Code("P0101", "`:` used where `=` belongs", """
Attributes are written `name = value`; only `params` declarations use `name: type = default`.

    image: "ghcr.io/acme/train:1"     # wrong
    image = "ghcr.io/acme/train:1"    # right"""),
    Code("P0102", "missing `=` after an attribute name", """
An attribute is `name = value`.  A name followed directly by a value lacks its `=`.

    image "ghcr.io/acme/train:1"      # wrong
    image = "ghcr.io/acme/train:1"    # right"""),
    Code("P0103", "unclosed block", """
A `{` has no matching `}`.  The error points at the opening brace and at where the parser
noticed (usually the next top-level block or the end of the file)."""),
    Code("P0104", "comma between attributes", """
Attributes are separated by newlines or spaces, not commas.  Commas separate list items only.

    resources { cpu = 8, memory = 32Gi }   # wrong
    resources { cpu = 8  memory = 32Gi }   # right"""),
    Code("P0105", "single-quoted string", """
Strings use double quotes.  `'text'` is not a string in `.pipe`.

    image = 'ghcr.io/acme/train:1'   # wrong
    image = "ghcr.io/acme/train:1"   # right"""),
    Code("P0106", "unexpected character", """
A character that cannot start any token (for example `;`, `@` or a control character)."""),
    Code("P0107", "unterminated string or heredoc", """
A string must close on the line where it opens; a heredoc `<<EOT` must end with a line that
holds only its tag (`EOT`)."""),
    Code("P0108", "invalid `${...}` interpolation", """
Inside a string, `${...}` must hold one dotted reference such as `${params.lr}` or
`${prep.outputs.data}`.  Write `$${` for a literal `${`."""),
    Code("P0109", "duplicate attribute or block", """
The same attribute or block appears twice in one block.  Keep one; the later one would
otherwise silently win."""),
    Code("P0110", "invalid escape sequence in a string", """
Strings support the escapes \\\\ \\" \\n \\t \\r and \\uXXXX.  Any other backslash sequence is an
error, so that a Windows path or a regex is not silently changed."""),
    Code("P0111", "number too large", """
A number literal is beyond what a 64-bit float can hold (`1e309`), so it would read as infinity.
Write the value you mean; sizes and durations take units (`1Ti`, `7d`)."""),
    # -- schema ---------------------------------------------------------------------------
    Code("P0201", "unknown attribute or block", """
The name is not part of the language at this place.  The hint suggests the closest known name;
`docs/language.md` lists every attribute of every block."""),
    Code("P0202", "missing required attribute", """
A required attribute is absent, for example a stage without `image` (and no `image` in
`defaults`), or a file without a `pipeline` block."""),
    Code("P0203", "wrong type of value", """
The value has the wrong type for the attribute, e.g. a string where a number is expected, or a
single value where a list is expected."""),
    Code("P0204", "value out of range", """
The number is outside the allowed range, e.g. `retry { attempts = -1 }` or a GPU count of 0."""),
    Code("P0205", "invalid quantity or duration", """
Memory sizes are a number and a unit (`512Mi`, `16Gi`, `1Ti`, or decimal `500M`); durations are
a number and one of `s m h d` (`30m`, `12h`, `7d`, `1h30m`); CPU is a plain number of cores
(`8`, `0.5`) or the quoted Kubernetes form `"500m"`."""),
    Code("P0206", "value is not one of the allowed choices", """
The attribute takes one of a fixed set of words, e.g. `kind = "workflow" | "template" | "cron"`
or `checkpoint { scope = "inputs" | "run" | "pipeline" }`."""),
    Code("P0207", "misplaced or repeated top-level block", """
A file has exactly one `pipeline "name" { }` block, at most one `params` and one `defaults`
block, and any number of `stage "name" { }` blocks.  Only those four appear at top level."""),
    Code("P0208", "unknown function", """
The only function is `secret("secret-name", "key")`, usable as an `env` value."""),
    Code("P0209", "attribute not allowed in `defaults`", """
`defaults` holds settings shared by every stage.  Graph edges and outputs (`needs`, `inputs`,
`outputs`) are per stage and cannot be defaulted."""),
    # -- semantics ------------------------------------------------------------------------
    Code("P0301", "unknown reference", """
A reference names a param, stage or output that does not exist.  References are
`params.NAME`, `STAGE.outputs.NAME` or a bare stage name (in `needs`)."""),
    Code("P0302", "dependency cycle", """
Stages depend on each other in a cycle (through output references or `needs`), so no order can
run them.  The message lists the cycle."""),
    Code("P0303", "duplicate stage name", """
Two stages have the same name.  Stage names are unique within a pipeline."""),
    Code("P0304", "duplicate parameter", """
Two params have the same name."""),
    Code("P0305", "invalid name", """
Pipeline, stage, param and output names become Kubernetes and Argo names: lower-case letters,
digits and `-` (stage and pipeline names; at most 50 characters so that generated names fit),
or letters, digits and `_` for params and outputs."""),
    Code("P0306", "stage needs exactly one of `command` and `script`", """
A stage runs either an exec-form `command = [...]` or a shell `script = <<EOT ... EOT`."""),
    Code("P0307", "param default does not match its type", """
`epochs: int = "three"` is rejected: the default must have the declared type."""),
    Code("P0308", "a stage depends on itself", """
A stage cannot read its own outputs or list itself in `needs`."""),
    Code("P0311", "unknown GPU type", """
The GPU type is not in the catalogue of the pipeline's cluster profile.  Add it to
`pipeline { cluster { gpu_products { NAME = "node-label-value" } } }` if your cluster has it."""),
    Code("P0312", "OOM memory ladder is not increasing", """
`retry { on_oom { memory = [...] } }` lists sizes to climb through on each out-of-memory kill;
each size must be larger than the one before."""),
    Code("P0313", "`resources.memory` disagrees with the OOM ladder", """
With an OOM ladder, the first rung is the stage's memory.  Either drop `resources.memory` or make
it equal to the first rung."""),
    Code("P0314", "inconsistent GPU request", """
`fallback_after` needs at least two GPU types to fall back between."""),
    Code("P0315", "`last_attempt_on_demand` without `interruptible`", """
Only an interruptible (spot) stage can move its last attempt to on-demand capacity."""),
    Code("P0316", "invalid cron schedule", """
A schedule has five fields (minute hour day-of-month month day-of-week), or is one of the
macros `@hourly @daily @weekly @monthly @yearly`."""),
    Code("P0317", "checkpoint or cache needs pipeline storage", """
Checkpoints and cached data live under the pipeline's `storage` URI.  Set
`pipeline "x" { storage = "s3://bucket/prefix" }`."""),
    Code("P0318", "a `distributed` stage must request GPUs or CPUs per node", """
A multi-node stage declares the resources of one node; without them the JobSet cannot place its
pods sensibly."""),
    Code("P0319", "unused or conflicting stage setting", """
The stage sets something that has no effect in its configuration, e.g. `retry { max_backoff = 10m }`
or `backoff_factor` without a `backoff` (there is no delay to grow or cap)."""),
    Code("P0320", "unknown time zone", """
`timezone` must name a zone of the IANA time zone database (`Europe/Berlin`, `America/New_York`,
`UTC`), as Argo's CronWorkflow controller loads it with Go's `time.LoadLocation`; a misspelt
zone would be accepted by `check` and refused by the cluster."""),
    Code("P0321", "not a valid Kubernetes name, label or annotation", """
The API server refuses the object: a label value is empty or at most 63 characters of letters,
digits, `-`, `_` and `.`, starting and ending with a letter or digit (`"a: b # c"` is not one);
a label or annotation key is `[prefix/]name`, the prefix a DNS subdomain (`example.com`), the
name like a label value; a namespace is a DNS-1123 label; a service account, a storage secret
and a `secret()` name are DNS subdomains, and a `secret()` key holds letters, digits, `-`, `_`
and `.`.  The same holds for what a stage names (`service_account`, `priority_class`,
`image_pull_secrets`, a volume's `claim`, `secret` and `config_map`, all DNS subdomains; a
volume's own name, a DNS-1123 label) and for the node labels of `node_selector` and `affinity`
(keys and values as labels)."""),
    Code("P0342", "invalid toleration", """
A toleration is written as `kubectl taint` writes the taint it tolerates: `key`,
`key:Effect`, `key=value` or `key=value:Effect`, the effect one of `NoSchedule`,
`PreferNoSchedule` and `NoExecute`.  Without `=value` it tolerates every value of the key.

    tolerations = ["nvidia.com/gpu:NoSchedule", "dedicated=ml:NoSchedule"]"""),
    Code("P0343", "invalid volume", """
A volume names exactly one source (`claim`, `secret` or `config_map`) and is mounted at an
absolute `path` that no other volume uses and that does not overlap what the compiled pod mounts
itself (`/var/run/durapipe`, `/dev/shm`, the checkpoint path).

    volumes { data { claim = "datasets" path = "/data" read_only = true } }"""),
    Code("P0344", "`pod_patch` does not fit the Pod spec", """
`pod_patch` is a JSON strategic-merge patch of the pod spec.  It is checked against the
Kubernetes PodSpec schema (the one JobSet v0.12.0's CRD embeds): every key must be a field at its
place, and every value of the field's type.  `$patch` directives and `null` (delete) pass."""),
    Code("P0345", "`schedule` conflicts with the output kind", """
A pipeline with a `schedule` compiles to a CronWorkflow.  Asking for a Workflow or a
WorkflowTemplate (`kind = ...` or `--kind`) would drop the schedule, so it is an error: drop
`kind`, or drop `schedule`."""),
    Code("P0346", "`checkpoint_gc` has no image to run in", """
The collector is a CronWorkflow whose one pod runs the durapipe runtime, which needs Python 3.10
or later.  Without `image` in the block it runs in the image of the first stage that
checkpoints; a pipeline with no such stage must name one.

    checkpoint_gc { schedule = "0 3 * * *"  max_age = 14d  image = "python:3.12-slim" }"""),
    # -- compilation ----------------------------------------------------------------------
    Code("P0401", "construct cannot be lowered to the target Argo version", """
The construct needs a feature that the chosen `--argo-version` lacks (for example
`pendingTimeout`, new in Argo 4.1).  Target a newer Argo or drop the construct."""),
    Code("P0402", "generated names collide or are too long", """
Two stages map to the same Argo name, or a generated name exceeds Kubernetes' limit.  Rename a
stage."""),
    Code("P0403", "compiled object exceeds Argo limits", """
An object would exceed Argo's limits (1 MiB per object) even after splitting into nested DAGs and
WorkflowTemplates."""),
    Code("P0404", "text would be read as Argo templating", """
Argo substitutes `{{...}}` in every string of a workflow, several times over, so user text that
contains `{{` (or a `{` directly before a `${...}` reference) could be executed as an Argo
variable or expression.  durapipe refuses it rather than guessing, in every string of the pipeline
(namespace, secrets, labels and annotations and their keys, cluster settings, env names ...), and
`check`, `compile` and `durapipe run` refuse the same text with this same diagnostic.  Move the
text into a file in the image, or build it at run time inside the command."""),
    Code("P0405", "reference cannot be lowered here", """
A bare stage name is an order-only dependency: it belongs in `needs`, not in a command, argument
or environment value, where only `params.NAME` and `STAGE.outputs.NAME` have a value."""),
    Code("P0406", "GPU request cannot be lowered", """
Every GPU type must map to a node label value of the cluster profile, and GPU types whose counts
differ need `fallback_after` (one pod cannot request a count that depends on the node it lands
on).  Add the type to `cluster { gpu_products { ... } }` or set `fallback_after`."""),
    Code("P0407", "setting not supported on a multi-node stage", """
A `distributed` stage runs as a JobSet created by an Argo resource template.  Declared outputs,
the OOM memory ladder and GPU fallback with a queue wait cannot be lowered there: pods of a JobSet
cannot hand output parameters to Argo, and JobSet restarts replace Argo retries.  Drop the
setting or split the stage."""),
    Code("P0408", "output kind needs a setting", """
`kind = "cron"` (or `--kind cron`) needs at least one `schedule`."""),
    Code("P0409", "object too large for a default Argo CD sync", """
Argo CD syncs with client-side apply unless told otherwise, and so does `kubectl apply`: each
object is stored whole, as JSON, in its `kubectl.kubernetes.io/last-applied-configuration`
annotation, and Kubernetes refuses an object whose annotations exceed 262,144 bytes.
`durapipe compile` refuses GitOps output (`-o DIR/`, `--gitops`) that holds such an object,
rather than leaving the sync to fail.  Split the pipeline into several (a Workflow of some
hundred stages can get there), or, for the runtime's ConfigMap, ship the runtime in an image
(`--runtime-image`).  An object annotated `argocd.argoproj.io/sync-options:
ServerSideApply=true` is applied server-side, keeps no such annotation and is not counted."""),
    # -- worst-case bounds (`durapipe bound`) ---------------------------------------------
    Code("P0350", "a stage without `timeout` has no worst case", """
`durapipe bound` prices every attempt at its `timeout`: an attempt of a stage without one may
run for ever, so the stage's (and the pipeline's) worst wall time, GPU-hours and cost have no
bound.  Give the stage the longest one attempt may run:

    stage "train" {
      timeout = 24h
    }"""),
    Code("P0351", "a multi-node stage restarts on preemption without a budget", """
A `distributed` stage with `restart_on_maintenance = true` (the default) restarts its whole
group after a preemption or host maintenance without spending `max_restarts`, so nothing
counts how often that happens and the worst case has no bound.  Set
`restart_on_maintenance = false` to make preemptions spend `max_restarts`:

    distributed {
      replicas               = 4
      max_restarts           = 6
      restart_on_maintenance = false
    }"""),
    Code("P0352", "a GPU type has no price", """
The cost of the worst case multiplies GPU-hours by a price per GPU-hour.  The default price
table (`durapipe.dsl.catalog.GPU_PRICES`) holds the catalogue's types; a type the cluster
block adds has none.  Give it one in the pipeline, where `check` and `compile` (and a
`limits.max_cost`) see it too:

    pipeline "p" {
      prices { gpu { MI300X = 4.5 } }
    }

or in a price file passed to `durapipe bound --prices FILE`, which overrides the pipeline's:

    {"gpu": {"MI300X": 4.5}}"""),
    Code("P0353", "invalid price file", """
`--prices FILE` takes a JSON object with any of `gpu` (GPU type name to US dollars per
GPU-hour), `cpu_hour` (per vCPU-hour) and `memory_gib_hour` (per GiB-hour); each price is a
finite number >= 0 and overrides the default:

    {"gpu": {"H100": 4.1}, "cpu_hour": 0.04, "memory_gib_hour": 0.005}"""),
    Code("P0354", "a stage's worst case exceeds its `limits`", """
The stage's `limits` block caps its worst case: wall time (`max_wall`), GPU-hours
(`max_gpu_hours`) or cost in US dollars (`max_cost`), as `durapipe bound` computes them
(every retry budget spent, every attempt to its `timeout`).  `check` and `compile` refuse the
pipeline; the help names the budget whose removal lowers the figure most.  Lower it (or the
`timeout`, which every worst-case attempt runs to), or raise the limit:

    stage "train" {
      timeout = 12h
      retry { preemptions = 3 }           # 4 attempts x 12h = 48h at worst
      limits { max_wall = 48h }
    }"""),
    Code("P0355", "the pipeline's worst case exceeds its `limits`", """
The pipeline block's `limits` cap the whole pipeline's worst case: `max_wall` along its
critical path (the chain of stages whose worst wall times sum highest), `max_gpu_hours` and
`max_cost` summed over every stage.  `check` and `compile` refuse the pipeline and name the
stage that dominates (for wall time, the critical path's longest stage) and its budget to
lower:

    pipeline "p" {
      limits { max_wall = 48h  max_gpu_hours = 2000  max_cost = 5000 }
    }"""),
    # -- warnings -------------------------------------------------------------------------
    Code("W0001", "unused parameter", """
A param is declared but no stage refers to it."""),
    Code("W0002", "cache on a stage with no declared outputs", """
A cached stage with no outputs can only skip work; nothing downstream can depend on what it
produced.  This is allowed, but usually a mistake."""),
    Code("W0004", "a GPU stage without a Kueue queue", """
Some stages of the pipeline name a Kueue LocalQueue (`queue = "..."`) and this GPU stage names
none, so its pods bypass the quota the others are admitted under; on a cluster where Kueue
manages every pod (`manageJobsWithoutQueueName`) they would never start.  Name a queue on the
stage, or one on the pipeline block, which every stage without its own inherits."""),
    Code("W0005", "a cached stage's image named by a tag", """
The cache key holds the image as written.  A tag (`ghcr.io/acme/train:2.3`) can be pushed again
with other contents, and the key does not change: the next run reuses results the old image
built (Argo's own memoization has the same trap).  A digest cannot move:

    image = "ghcr.io/acme/train:2.3"                                  # warned
    image = "ghcr.io/acme/train:2.3@sha256:4f1c..."                   # the tag for people, the digest for the key

Where results must follow a moved tag, bump `cache { version = "..." }` when it moves."""),
    Code("W0006", "a price for an unknown GPU type", """
`prices { gpu { ... } }` names a GPU type that neither the catalogue (for the pipeline's
`profile`) nor `cluster { gpu_products { ... } }` knows, so no stage can ask for it and the price
prices nothing.  Usually a typo, which leaves the type it meant at the default price:

    prices { gpu { H10O = 2.5 } }     # warned: did you mean H100?
    prices { gpu { H100 = 2.5 } }"""),
    Code("W0003", "a credential written into the pipeline", """
An `env` value or the `storage` URI looks like a credential: an AWS access key id (`AKIA...`,
`ASIA...`), a 40-character secret key under a name with SECRET, PASSWORD or TOKEN in it,
`password=...`, or a password in a URI (`scheme://user:password@host`).  The compiled YAML
holds it as written, and GitOps commits that YAML.  Keep it in a Kubernetes Secret:

    env { DB_PASSWORD = "hunter2" }                        # warned
    env { DB_PASSWORD = secret("db-credentials", "password") }

For the store, drop the credentials from the URI and name a Secret that holds them:
`storage_secret = "durapipe-store"`.  The warning never shows the value (the source line is
shown masked)."""),
]

CODES: dict[str, Code] = {c.code: Code(c.code, c.title, c.explanation.strip("\n")) for c in _CODES}


def get(code: str) -> Code:
    return CODES[code]
