"""The trusted test process: runs a benchmark's own test code, in which every name the tests need
from the solution is a proxy that calls the candidate process over a pipe, and reports the
verdict on its own stdout. The candidate never runs here and can reach nothing here but the
values it returns, which arrive as plain data (see `_wire`).

Run as `python -I -B _test_runner.py IN_FD OUT_FD` with a JSON config on stdin (limits, the
candidate's source, prelude and test code, proxied names, timeout); standard library only.
"""

import builtins
import json
import os
import secrets
import select
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _candidate_server  # noqa: E402
import _wire  # noqa: E402

sys.path.pop(0)

_NOT_RAISED = {"StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt", "SystemExit"}


class SolutionError(Exception):
    """An exception the solution raised whose type is not a builtin exception."""


class ChannelBroken(BaseException):
    """The candidate process died, timed out or broke the protocol: never caught by tests."""


class Channel:
    """Calls into the candidate process; any failure of the channel fails the sample."""

    def __init__(self, in_fd, out_fd, deadline):
        self.in_fd, self.out_fd, self.deadline = in_fd, out_fd, deadline
        self.broken = None

    def request(self, message):
        if self.broken:
            raise ChannelBroken(self.broken)
        # A fresh random nonce per request, which the reply must carry: the candidate holds
        # its reply pipe, and bytes it wrote there before this request (say, replies to the
        # tests' calls written at load) cannot answer it.
        nonce = secrets.token_hex(16)
        try:
            _wire.send(self.out_fd, {**message, "n": nonce})
            remaining = self.deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.in_fd], [], [], remaining)[0]:
                self.broken = "timeout"
                raise ChannelBroken("the solution did not answer in time")
            reply = _wire.receive(self.in_fd)
        except ChannelBroken:
            raise
        except (OSError, _wire.WireError) as e:
            self.broken = f"channel: {e}"
            raise ChannelBroken(self.broken) from None
        if reply.get("re") != nonce:
            self.broken = "protocol: a reply that answers no request"
            raise ChannelBroken(self.broken)
        if "stop" in reply and reply["stop"] is True and message["op"] == "next":
            raise StopIteration
        if "raise" in reply:
            name, text = reply["raise"] if _is_pair(reply["raise"]) else ("Exception", "malformed error")
            text = text[:_candidate_server.MAX_MESSAGE_CHARS]
            error = getattr(builtins, name, None)
            if not (isinstance(error, type) and issubclass(error, Exception)) or name in _NOT_RAISED:
                raise SolutionError(f"{name}: {text}")
            raise error(text)
        if "value" not in reply:
            self.broken = "protocol: reply without a value"
            raise ChannelBroken(self.broken)
        try:
            return _wire.decode(reply["value"], lambda n: Handle(self, n))
        except _wire.WireError as e:
            self.broken = f"protocol: {e}"
            raise ChannelBroken(self.broken) from None

    def send_value(self, value):
        def handle_number(obj):
            if type(obj) is Handle and obj._channel is self:
                return obj._number
            raise TypeError(f"a {type(obj).__name__} cannot be passed to the solution; only plain data can")

        return _wire.encode(value, handle_number)

    def call(self, target, args, kwargs):
        return self.request({"op": "call", **target, "args": [self.send_value(a) for a in args],
                             "kwargs": [[k, self.send_value(v)] for k, v in kwargs.items()]})


def _is_pair(value):
    return type(value) is list and len(value) == 2 and all(type(v) is str for v in value)


class Proxy:
    """A name the solution defines, seen from the tests: calling it calls the solution."""

    __slots__ = ("_channel", "_name")

    def __init__(self, channel, name):
        self._channel, self._name = channel, name

    def __call__(self, *args, **kwargs):
        return self._channel.call({"name": self._name}, args, kwargs)

    def __getattr__(self, attr):
        return self._channel.request({"op": "getattr", "h": self._resolve()._number, "attr": attr})

    def _resolve(self):
        value = self._channel.request({"op": "get", "name": self._name})
        if type(value) is not Handle:
            raise TypeError(f"{self._name} is not an object of the solution")
        return value

    def __repr__(self):
        return f"<solution's {self._name}>"


class Handle:
    """An object that lives in the candidate process. It is equal only to itself, so it can be
    passed back to the solution but never satisfies a comparison with expected data."""

    __slots__ = ("_channel", "_number")

    def __init__(self, channel, number):
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_number", number)

    def _op(self, op, **fields):
        return self._channel.request({"op": op, "h": self._number, **fields})

    def __eq__(self, other):
        return type(other) is Handle and other._channel is self._channel and other._number == self._number

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(("handle", self._number))

    def __call__(self, *args, **kwargs):
        return self._channel.call({"h": self._number}, args, kwargs)

    def __getattr__(self, attr):
        return self._op("getattr", attr=attr)

    def __setattr__(self, attr, value):
        self._op("setattr", attr=attr, value=self._channel.send_value(value))

    def __iter__(self):
        return self._op("iter")

    def __next__(self):
        return self._op("next")

    def __len__(self):
        value = self._op("len")
        if type(value) is not int:
            raise TypeError("len() of a solution object must be an int")
        return value

    def __getitem__(self, key):
        return self._op("getitem", key=self._channel.send_value(key))

    def __contains__(self, item):
        return self._op("contains", item=self._channel.send_value(item)) is True

    def __bool__(self):
        return self._op("bool") is True

    def __repr__(self):
        value = self._op("repr")
        return value if type(value) is str else "<solution object>"

    def __str__(self):
        value = self._op("str")
        return value if type(value) is str else "<solution object>"


def main():
    in_fd, out_fd = int(sys.argv[1]), int(sys.argv[2])
    config = json.loads(sys.stdin.read())
    _candidate_server.limit(config["limits"])
    sys.set_int_max_str_digits(0)
    verdict_fd = os.dup(1)
    os.dup2(2, 1)
    channel = Channel(in_fd, out_fd, time.monotonic() + config["timeout_s"])
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    verdict = {"passed": False, "status": "failed", "error": None}
    try:
        exec(compile(config["prelude"], "prelude.py", "exec"), namespace)
        channel.request({"op": "load", "source": config["candidate"]})
        for name in config["proxies"]:
            namespace[name] = Proxy(channel, name)
        exec(compile(config["tests"], "tests.py", "exec"), namespace)
        if channel.broken:
            raise ChannelBroken(channel.broken)
        verdict = {"passed": True, "status": "passed", "error": None}
    except BaseException as e:  # noqa: BLE001 - every way out but the end is a failure
        traceback.print_exc()
        status = "timeout" if channel.broken == "timeout" else "failed"
        verdict = {"passed": False, "status": status, "error": f"{type(e).__name__}: {e}"[:2000]}
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.write(verdict_fd, json.dumps(verdict).encode() + b"\n")
    os._exit(0)


if __name__ == "__main__":
    main()
