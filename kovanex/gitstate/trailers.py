"""Commit messages with a git trailer block: build them and parse them back.

Stdlib only, on purpose: the push-path hook imports this module and must start in a couple of
milliseconds (docs/ARCHITECTURE.md section 2), so nothing here may pull in pygit2 or jsonschema.
The shape is the one `git interpret-trailers --parse` understands, so `git log` users and
kovanex agree on what a commit says.
"""

from __future__ import annotations

import re

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]*$")


def build_message(subject: str, trailers: list[tuple[str, str]], body: str = "") -> str:
    """subject, blank line, optional body, blank line, trailer block (one `Key: value` a line)."""
    subject = " ".join(subject.split())
    if not subject:
        raise ValueError("empty subject")
    lines = []
    for key, value in trailers:
        if not _KEY.match(key):
            raise ValueError(f"bad trailer key {key!r}")
        if "\n" in value or "\r" in value:
            raise ValueError(f"trailer {key} value spans lines: {value!r}")
        lines.append(f"{key}: {value.strip()}")
    parts = [subject]
    body = body.strip("\n")
    if body.strip():
        parts.append(body)
    if lines:
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def subject(message: str) -> str:
    return message.split("\n", 1)[0].strip()


def parse_trailers(message: str) -> list[tuple[str, str]]:
    """The trailer block of a message: its last paragraph, if every line there is a trailer.

    The subject paragraph never counts (git agrees). Continuation lines (leading whitespace)
    are folded into the previous value, as git does. Stricter than git's 25%-garbage rule on
    purpose: a paragraph that is only partly trailers is prose, not state.
    """
    text = message.replace("\r\n", "\n").rstrip("\n")
    last = _last_paragraph(text)
    if last is None:
        return []
    out: list[tuple[str, str]] = []
    for line in last.split("\n"):
        if line[:1] in (" ", "\t") and out:
            k, v = out[-1]
            out[-1] = (k, f"{v} {line.strip()}".strip())
            continue
        # partition, not a regex over the line: a 64 KiB line without a colon is one memchr
        key, colon, value = line.partition(":")
        key = key.rstrip(" \t")
        if not colon or not _KEY.match(key):
            return []
        out.append((key, value.strip()))
    return out


def _last_paragraph(text: str) -> str | None:
    """What follows the last blank line, found from the end: a 64 KiB message costs what
    its trailer block does, not a split of all of it (issue 24). None: one paragraph."""
    end = pos = len(text)
    while True:
        nl = text.rfind("\n", 0, pos)
        if nl < 0:
            return None
        if pos < end and not text[nl + 1 : pos].strip(" \t"):
            return text[pos + 1 :]
        pos = nl


def trailer_dict(message: str) -> dict[str, str]:
    """Trailers as a dict; a repeated key keeps its last value."""
    return dict(parse_trailers(message))
