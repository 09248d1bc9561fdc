"""A request to a server tokenflip does not control, bounded: the whole answer within a
deadline (a server sending one byte every few seconds, in its headers or its body, never
holds a job), at most so many bytes after decompression (a gzip bomb or an endless body is
cut off as it grows), and a redirect never followed (the key it carries would go to wherever
it points). The completions themselves go through the `openai` client with the same bounds
(`run/engines/endpoint/client`); this is for everything else a job asks a server: its model
list, version, tokenizer routes.
"""

from __future__ import annotations

import time
from typing import Any

from tokenflip.core.inputs import loads_json

# The most a side request's answer may take (a model list, a tokenize route's ids of a prompt).
LARGEST_ANSWER = 4 << 20


class BoundedHTTPError(OSError):
    """An answer that took too long, grew too large or pointed elsewhere: never used."""


def fetch(method: str, url: str, *, headers: dict[str, str] | None = None, timeout: float = 10.0,
          body: Any = None, largest: int = LARGEST_ANSWER, http=None) -> tuple[int, bytes]:
    """`method url` (with JSON `body`): the status and the body's bytes, decompressed. Raises
    `BoundedHTTPError` past `largest` bytes, past `timeout` seconds in all (connecting,
    headers and body: a watchdog closes the answer at the deadline, whatever the server
    trickles), or on a redirect; transport errors as httpx raises them. `http`: an
    `httpx2.Client` to reuse (its connection pool), else one for this call."""
    import threading

    done, held, outcome = threading.Event(), {}, {}

    def run():
        try:
            outcome["value"] = _fetch(method, url, headers, timeout, body, largest, http, held)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"fetch {url[:80]}", daemon=True).start()
    if not done.wait(timeout + 1.0):
        answer = held.get("response")
        if answer is not None:
            try:
                answer.close()  # the worker's next read fails; its thread ends
            except Exception:  # noqa: BLE001 - closing is best effort; the caller is told either way
                pass
        raise BoundedHTTPError(f"{url} did not finish its answer within {timeout:g} s in all")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _fetch(method, url, headers, timeout, body, largest, http, held) -> tuple[int, bytes]:
    import httpx2

    start, chunks, size = time.perf_counter(), [], 0
    sender = http if http is not None else httpx2
    kwargs = {"headers": headers or {}, "timeout": timeout, "follow_redirects": False}
    if body is not None:
        kwargs["json"] = body
    with sender.stream(method, url, **kwargs) as response:
        held["response"] = response
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
        return status, loads_json(text, url, finite=False), text[:200]
    except ValueError:  # not JSON, or JSON no answer holds (nested too deep, a 5,000-digit number)
        return status, None, text[:200]
