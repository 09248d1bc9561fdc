"""A request to a server tokenflip does not control, bounded: the whole answer within a
deadline (a server sending one byte every few seconds never holds a job), at most so many
bytes after decompression (a gzip bomb or an endless body is cut off as it grows), and a
redirect never followed (the key it carries would go to wherever it points). The completions
themselves go through the `openai` client with the same bounds (`run/engines/endpoint/client`);
this is for everything else a job asks a server: its model list, version, tokenizer routes.
"""

from __future__ import annotations

import json
import time
from typing import Any

# The most a side request's answer may take (a model list, a tokenize route's ids of a prompt).
LARGEST_ANSWER = 4 << 20


class BoundedHTTPError(OSError):
    """An answer that took too long, grew too large or pointed elsewhere: never used."""


def fetch(method: str, url: str, *, headers: dict[str, str] | None = None, timeout: float = 10.0,
          body: Any = None, largest: int = LARGEST_ANSWER, http=None) -> tuple[int, bytes]:
    """`method url` (with JSON `body`): the status and the body's bytes, decompressed. Raises
    `BoundedHTTPError` past `largest` bytes, past `timeout` seconds in all (a read may take up
    to `timeout` more before the check), or on a redirect; transport errors as httpx raises
    them. `http`: an `httpx2.Client` to reuse (its connection pool), else one for this call."""
    import httpx2

    start, chunks, size = time.perf_counter(), [], 0
    sender = http if http is not None else httpx2
    kwargs = {"headers": headers or {}, "timeout": timeout, "follow_redirects": False}
    if body is not None:
        kwargs["json"] = body
    with sender.stream(method, url, **kwargs) as response:
        if 300 <= response.status_code < 400:
            raise BoundedHTTPError(f"{url} answered {response.status_code}, a redirect to "
                                   f"{response.headers.get('location', '(no location)')[:200]!r}: not followed")
        for chunk in response.iter_bytes():
            size += len(chunk)
            if size > largest:
                raise BoundedHTTPError(f"{url} answered more than {largest:,} bytes: cut off")
            if time.perf_counter() - start > timeout:
                raise BoundedHTTPError(f"{url} did not finish its answer within {timeout:g} s in all")
            chunks.append(chunk)
        return response.status_code, b"".join(chunks)


def fetch_json(method: str, url: str, **kwargs) -> tuple[int, Any, str]:
    """`fetch`, its body decoded: (status, the JSON value or None where it is none, the
    text's first 200 characters for a message)."""
    status, data = fetch(method, url, **kwargs)
    text = data.decode("utf-8", "replace")
    try:
        return status, json.loads(text), text[:200]
    except ValueError:
        return status, None, text[:200]
