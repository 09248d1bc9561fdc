"""The traffic a live endpoint cell sends: its own requests, at most `concurrency` in flight,
in the order its `order` axis names, while `load` other requests are kept in flight beside
them; every request through the `openai` package's async client, retried with bounded
backoff on what a server under load answers (connection lost, time out, 408/409/429/5xx, a
body that is not the JSON the API promises), then failed naming the request.

What the client really held is measured, not assumed: every start and end of a request
moves a counter, and the cell records the most and the time-weighted mean of its own and
the background requests in flight while its own ran (`traffic`), so a cell whose client
could not hold what its name says fails its proof instead of being compared as if it had.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tokenflip.core.excerpt import excerpt, keep_secret
from tokenflip.core.inputs import InputError, loads_json

# Statuses a server sends when it is busy or restarting: worth another try.
RETRY_STATUSES = (408, 409, 425, 429, 500, 502, 503, 504)
# Backoff: 0.25 s, doubling, at most 8 s a wait (a server's Retry-After, up to 30 s, wins).
FIRST_WAIT_S, LONGEST_WAIT_S, LONGEST_RETRY_AFTER_S = 0.25, 8.0, 30.0
# The in-flight trace a cell keeps (evenly thinned beyond this many changes).
TRACE_POINTS = 2000


class EndpointError(RuntimeError):
    """A request that failed after its retries, or a server that answered what no cell can use."""


class MalformedResponse(ValueError):
    """A 2xx body that is not the JSON object the API promises."""


class AnswerTooLarge(MalformedResponse):
    """An answer larger than any answer to the request can be (not retried)."""


class Redirected(MalformedResponse):
    """A 3xx answer: never followed (not retried)."""


# The most an answer may take: 1 MiB, and 64 KiB a token asked (its text, ids and top-k).
BYTES_BASE, BYTES_PER_TOKEN = 1 << 20, 1 << 16


@dataclass
class Answer:
    body: dict[str, Any]
    headers: dict[str, str]
    attempts: int
    seconds: float


@dataclass
class InFlight:
    """Requests in flight over time: the cell's own (`measured`) and the background's."""

    start: float = field(default_factory=time.perf_counter)
    measured: int = 0
    background: int = 0
    trace: list[tuple[float, int, int]] = field(default_factory=list)

    def change(self, measured: int = 0, background: int = 0) -> None:
        self.measured += measured
        self.background += background
        self.trace.append((time.perf_counter() - self.start, self.measured, self.background))

    def summary(self) -> dict[str, Any]:
        """While the cell's own requests were in flight: the most of each kind and their
        time-weighted means; and the trace (seconds, own, background), thinned."""
        most_own = most_bg = 0
        weighted_own = weighted_bg = busy = 0.0
        for (t0, own, bg), (t1, _, _) in zip(self.trace, self.trace[1:]):
            if own > 0:
                most_own, most_bg = max(most_own, own), max(most_bg, bg)
                weighted_own += own * (t1 - t0)
                weighted_bg += bg * (t1 - t0)
                busy += t1 - t0
        step = max(1, -(-len(self.trace) // TRACE_POINTS))
        return {"most_in_flight": most_own, "mean_in_flight": weighted_own / busy if busy else 0.0,
                "seconds": busy,
                "background": {"most_in_flight": most_bg, "mean_in_flight": weighted_bg / busy if busy else 0.0},
                "trace": [[round(t, 4), own, bg] for t, own, bg in self.trace[::step]]}


def api_key(spec: dict[str, Any]) -> str:
    """The key from the variable the endpoint names (never from the config, never recorded);
    servers without authentication get a placeholder the client requires."""
    name = spec.get("api_key_env")
    if not name:
        return "none"
    value = os.environ.get(name)
    if not value:
        raise EndpointError(f"endpoint {spec['url']}: its API key variable ${name} is not set in this job's "
                            f"environment")
    return keep_secret(value)


def client(spec: dict[str, Any], connections: int):
    """The `openai` async client for an endpoint, with room for every request the cell keeps
    in flight; retries are this module's (one policy for every fault, each request named)."""
    import openai
    from httpx2 import Limits

    return openai.AsyncOpenAI(
        base_url=spec["url"], api_key=api_key(spec), timeout=float(spec["timeout_s"]), max_retries=0,
        http_client=openai.DefaultAsyncHttpxClient(
            limits=Limits(max_connections=connections + 8, max_keepalive_connections=connections + 8),
            follow_redirects=False))  # a redirect is an error (`Redirected`), never followed with the key


async def _once(api, spec: dict[str, Any], body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """One request as the API kind names it; the decoded JSON body and the headers."""
    known = {"model", "prompt", "messages", "max_tokens", "temperature", "top_p", "logprobs", "top_logprobs", "seed",
             "stop"}
    args = {key: value for key, value in body.items() if key in known}
    extra = {key: value for key, value in body.items() if key not in known}
    endpoint = api.chat.completions if spec["api"] == "chat" else api.completions
    largest = largest_answer(body)
    async with endpoint.with_streaming_response.create(**args, extra_body=extra or None) as raw:
        if 300 <= raw.http_response.status_code < 400:  # never followed: the key would go to wherever it points
            raise Redirected(redirected(raw.http_response.status_code, raw.http_response.headers))
        chunks, size = [], 0
        async for chunk in raw.http_response.aiter_bytes():  # decompressed: a gzip bomb is counted as it grows
            size += len(chunk)
            if size > largest:
                raise AnswerTooLarge(f"answered too much: the answer grew past {largest:,} bytes (at most "
                                     f"{BYTES_PER_TOKEN:,} a token asked, and {BYTES_BASE:,}), and was cut off")
            chunks.append(chunk)
        headers = dict(raw.http_response.headers)
    text = b"".join(chunks)
    try:
        data = loads_json(text.decode("utf-8"), "the body", finite=False)  # a logprob may be -Infinity
    except UnicodeDecodeError as exc:
        raise MalformedResponse(f"the body is not UTF-8 text (byte {exc.start}): {excerpt(text)}") from None
    except InputError as exc:
        raise MalformedResponse(f"{exc}: {excerpt(text)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise MalformedResponse(f"the body has no choices: {excerpt(text)}")
    return data, headers


def redirected(status: int, headers) -> str:
    """A redirect in words: never followed, so that no request (or its key) goes elsewhere."""
    return (f"answered {status}, a redirect to {headers.get('location', '(no location)')[:200]!r}: not followed, so "
            f"that no request (or its key) goes to another host; set the endpoint's url to where the server is")


def largest_answer(body: dict[str, Any]) -> int:
    """The most bytes an answer to `body` may take: room for every token asked with its top-k."""
    return BYTES_BASE + BYTES_PER_TOKEN * int(body.get("max_tokens") or 1)


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return min(float(value), LONGEST_RETRY_AFTER_S) if value is not None else None
    except ValueError:
        return None


async def request(api, spec: dict[str, Any], body: dict[str, Any], what: str) -> Answer:
    """`body` sent until it is answered, at most 1 + `retries` times with bounded backoff;
    else `EndpointError` naming `what` (the prompt), the URL, the attempts and the last fault."""
    import openai

    start = time.perf_counter()
    attempts = 1 + int(spec["retries"])
    for attempt in range(attempts):
        try:  # timeout_s bounds the whole answer, not only each read (one byte every few seconds never ends)
            data, headers = await asyncio.wait_for(_once(api, spec, body), float(spec["timeout_s"]))
            return Answer(data, headers, attempt + 1, time.perf_counter() - start)
        except (AnswerTooLarge, Redirected) as exc:
            raise EndpointError(f"{what}: {spec['url']} {exc}; nothing of this cell is recorded") from None
        except TimeoutError:
            fault, wait = f"no answer within timeout_s {spec['timeout_s']} (the whole answer, not each read)", None
        except openai.APIStatusError as exc:
            if 300 <= exc.status_code < 400:
                raise EndpointError(f"{what}: {spec['url']} {redirected(exc.status_code, exc.response.headers)}; "
                                    f"nothing of this cell is recorded") from None
            if exc.status_code not in RETRY_STATUSES:
                raise EndpointError(f"{what}: {spec['url']} answered {exc.status_code}: {_message(exc)}") from None
            fault, wait = f"status {exc.status_code}: {_message(exc)}", _retry_after(exc)
        except openai.APIConnectionError as exc:  # refused, reset, or no answer within timeout_s
            kind = "no answer within" if isinstance(exc, openai.APITimeoutError) else "connection failed"
            fault, wait = f"{kind} ({type(exc).__name__}: {exc}; timeout_s {spec['timeout_s']})", None
        except MalformedResponse as exc:
            fault, wait = f"malformed response: {exc}", None
        if attempt + 1 < attempts:
            await asyncio.sleep(wait if wait is not None else min(FIRST_WAIT_S * 2 ** attempt, LONGEST_WAIT_S))
    raise EndpointError(f"{what}: {spec['url']} failed {attempts} time(s) (1 + retries {spec['retries']}); "
                        f"last: {fault}")


def _message(exc) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        return str(inner.get("message", inner) if isinstance(inner, dict) else inner)[:300]
    return str(exc)[:300]


async def run(spec: dict[str, Any], bodies: list[tuple[str, dict[str, Any]]], concurrency: int,
              load: dict[str, Any] | None, background_body: Callable[[int], dict[str, Any]] | None
              ) -> tuple[list[Answer], dict[str, Any]]:
    """Send `bodies` ((what, body), in the order to send) with at most `concurrency` in
    flight, the first ones only once `load["requests"]` background requests are in flight;
    the answers in the order of `bodies`, and the traffic the cell recorded."""
    flights = InFlight()
    n_background = int(load["requests"]) if load else 0
    api = client(spec, concurrency + n_background)
    answers: list[Answer | None] = [None] * len(bodies)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(bodies)):
        queue.put_nowait(index)
    loaded, done = asyncio.Event(), asyncio.Event()
    background_sent = [0]

    async def own() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            what, body = bodies[index]
            flights.change(measured=1)
            try:
                answers[index] = await request(api, spec, body, what)
            finally:
                flights.change(measured=-1)

    async def neighbour(slot: int) -> None:
        while not done.is_set():
            number = background_sent[0]
            background_sent[0] += 1
            flights.change(background=1)
            if flights.background >= n_background:
                loaded.set()
            try:
                await request(api, spec, background_body(number), f"background request {number}")
            finally:
                flights.change(background=-1)

    cpu = time.process_time()
    async with api:
        neighbours = [asyncio.create_task(neighbour(slot)) for slot in range(n_background)]
        try:
            if neighbours:
                await _first_of(loaded.wait(), neighbours)
            await asyncio.gather(*(own() for _ in range(min(concurrency, len(bodies)))))
        finally:
            done.set()
            for task in neighbours:
                task.cancel()
            results = await asyncio.gather(*neighbours, return_exceptions=True)
        failed = [r for r in results if isinstance(r, EndpointError)]
        if failed:  # the cell did not run under the load its name says
            raise failed[0]
    traffic = {**flights.summary(), "client_cpu_seconds": time.process_time() - cpu,
               "attempts": sum(a.attempts for a in answers), "requests": len(bodies),
               "background_requests": background_sent[0]}
    return answers, traffic


async def _first_of(awaitable, tasks: list[asyncio.Task]) -> None:
    """Wait for `awaitable`, or fail at once if a background task fails before it."""
    waiter = asyncio.ensure_future(awaitable)
    finished, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in finished:
        if task is not waiter and task.exception() is not None:
            waiter.cancel()
            raise task.exception()
    if waiter not in finished:
        await waiter
