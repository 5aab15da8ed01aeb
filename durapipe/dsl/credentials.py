"""Text that looks like a credential, where the compiled YAML would keep it (W0003).

An ``env`` value and the ``storage`` URI are copied into the Workflow as written, and GitOps
commits that YAML.  The patterns are the ones that are hard to mistake: an AWS access key id,
a 40-character AWS-style secret key under a name that says it is a secret, ``password=``, and
a password in a URI's userinfo.  Only literal text counts: a ``${...}`` reference is not a
credential written here.  What is found is described, never returned: the caller must not
echo it.
"""

from __future__ import annotations

import re

from durapipe.dsl.model import Interp

#: A reference inside interpolated text, kept as one character no pattern accepts.
_REF = "\x00"

_AWS_KEY_ID_RE = re.compile(r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])")
_SECRET_NAME_RE = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN", re.IGNORECASE)
_SECRET_KEY_RE = re.compile(r"[A-Za-z0-9/+]{40}")
_PASSWORD_RE = re.compile(r"(?<![A-Za-z])pass(?:word|wd)=[^\s&;'\"\x00]", re.IGNORECASE)
_URI_PASSWORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:([^/\s@]+)@")


def literal_text(value: object) -> str | None:
    """The literal text of a string or interpolated string (references as a placeholder);
    ``None`` for what holds no literal text (a bare reference, ``secret()``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Interp):
        return "".join(p if isinstance(p, str) else _REF for p in value.parts)
    return None


def credential_kind(text: str, name: str = "") -> str | None:
    """What ``text`` (the value of ``name``, for env) looks like, if a credential: "an AWS
    access key id", "a secret key", "a password in a URI", "a password"."""
    if _AWS_KEY_ID_RE.search(text):
        return "an AWS access key id"
    if name and _SECRET_NAME_RE.search(name) and _SECRET_KEY_RE.fullmatch(text):
        return "a secret key"
    if any(set(found.group(1)) - {_REF} for found in _URI_PASSWORD_RE.finditer(text)):
        return "a password in a URI"
    if _PASSWORD_RE.search(text):
        return "a password"
    return None
