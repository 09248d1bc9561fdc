"""Content quoted in a message: short, printable, and never a secret.

A message about a file, a record or a server's answer names where the problem is; what it
quotes of the content is an excerpt of a few dozen characters, with every key this process
was given (`keep_secret`) and everything shaped like a credential masked. Messages reach CI
logs, which keep them: a prompts file that is really a credentials file, a server that echoes
the Authorization header, must not put a key there.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["keep_secret", "redacted", "excerpt", "MASK", "EXCERPT_CHARS"]

MASK = "«redacted»"
# Characters of content a message quotes: enough to recognise a value, too few to carry a file.
EXCERPT_CHARS = 40
# Secrets shorter than this are too common as substrings to mask ("1", "abc").
_SHORTEST_SECRET = 6
_SECRETS: set[str] = set()

# Credential shapes, each with the group that is the secret: what a log must never keep even
# where no key was given to this process (a credentials file read as data, an environment).
_CREDENTIAL_SHAPES = [
    # NAME=value or "name": "value" where the name says key, token, auth or session: a value
    # that could be a key (not NAME_ENV, which names the variable that holds one). Each name is
    # read from its start only, and bounded: a long run of letters is read once, not once a letter.
    (re.compile(r"(?i)(?<![A-Z0-9_.-])[A-Z0-9_.-]{0,64}(?:KEY|TOKEN|AUTH|SESSION)[A-Z0-9_.-]{0,64}"
                r"(?<![-_]env)[\"']?\s*[:=]\s*[\"']?(?:(?:bearer|basic|token)\s+)?([^\s\"',;&]+)"), 1, "opaque"),
    # ... where it says secret, password or credential: any value.
    (re.compile(r"(?i)(?<![A-Z0-9_.-])[A-Z0-9_.-]{0,64}(?:SECRET|PASSWORD|PASSWD|PWD|CREDENTIAL)[A-Z0-9_.-]{0,64}"
                r"[\"']?\s*[:=]\s*[\"']?([^\s\"',;&]{4,})"), 1),
    # A netrc's `password VALUE`.
    (re.compile(r"(?i)\b(?:password|passwd)\s+(?![(])([^\s\"',;&]{6,})"), 1),
    # An Authorization header's value (the Token scheme: a long value only, not prose's "token ids").
    (re.compile(r"(?i)\b(?:bearer|basic)\s+([A-Za-z0-9._~+/=-]+)"), 1),
    (re.compile(r"(?i)\btoken\s+([A-Za-z0-9._~+/=-]{16,})"), 1),
    # user:password@ in a URL.
    (re.compile(r"://([^/@\s]+)@"), 1),
    # Any NAME=value of an environment (/proc/self/environ, a .env file): the value goes.
    (re.compile(r"\b[A-Z][A-Z0-9_]{2,}=([^\s\x00]+)"), 1),
    # Well-known key prefixes.
    (re.compile(r"\b(?:sk|pk|rk|hf|ghp|gho|ghs|ghu|github_pat|glpat|xox[abpr]|AKIA|ASIA|AIza)[-_]?"
                r"([A-Za-z0-9_-]{8,})"), 1),
    # A long run of digits and letters of both cases mixed, with no word in it (six lower-case
    # letters in a row): an opaque token. A digest (lower-case hex), a path and a model's file
    # name ("SmolLM2-135M-Instruct_fp32") are none.
    (re.compile(r"(?<![A-Za-z0-9_+=-])((?=(?:[^\W\d_]*[\d_+=-]){3})(?=[A-Za-z0-9_+=-]*[A-Z])"
                r"(?=[A-Za-z0-9_+=-]*[a-z])(?![A-Za-z0-9_+=-]*[a-z]{6})[A-Za-z0-9_+=-]{24,})"), 1),
]


def keep_secret(value: str | None) -> str | None:
    """`value`, remembered as a secret of this process: every later `redacted` masks it."""
    if value and len(value) >= _SHORTEST_SECRET:
        _SECRETS.add(value)
    return value


def redacted(text: str) -> str:
    """`text` with every kept secret and every credential shape masked."""
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, MASK)
    for shape, group, *only in _CREDENTIAL_SHAPES:
        text = shape.sub(lambda m: m.group(0) if only and not _opaque(m.group(group)) else
                         m.group(0)[:m.start(group) - m.start(0)] + MASK + m.group(0)[m.end(group) - m.start(0):],
                         text)
    return text


def _opaque(value: str) -> bool:
    """A value after "key:" that could be a key: 8 characters or more, a letter among them, and
    not one word of prose or a number (a message's own "a key: name the variable", "tokens: 1000")."""
    return len(value) >= 8 and any(c.isalpha() for c in value) and not (value.isalpha() and value.islower())


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """`value` quoted for a message: redacted, cut to `limit` characters (its length said
    where it was longer), control characters escaped by `repr`. Only its start is read (four
    times what is shown, so that a secret running past the cut is still seen whole there)."""
    text = redacted(str(value)[: 4 * limit])
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(str(value)):,} characters)"
