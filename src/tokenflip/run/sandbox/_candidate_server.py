"""The candidate process: runs the model-written code and answers the trusted test process's
calls on it over a pipe, as plain data or opaque handles (see `_wire`). It decides nothing:
whatever it sends is only a value for the tests to judge.

Run as `python -I -B _candidate_server.py IN_FD OUT_FD CONFIG_JSON`; standard library only.
"""

import json
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sandbox_guard  # noqa: E402
import _wire  # noqa: E402

sys.path.pop(0)


def limit(limits):
    """Hard resource limits on this process (which may not create others, so they are the
    sample's); set before any candidate code runs."""
    pairs = [
        (resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1),
        (resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"]),
        (resource.RLIMIT_FSIZE, limits["file_size_bytes"], limits["file_size_bytes"]),
        (resource.RLIMIT_NOFILE, limits["open_files"], limits["open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
        # Queued signals are kernel objects (about 90 bytes each; the host's default allows some
        # 96,000); locked memory and POSIX queues are refused anyway, and 0 says so twice.
        (resource.RLIMIT_SIGPENDING, limits["pending_signals"], limits["pending_signals"]),
        (resource.RLIMIT_MEMLOCK, 0, 0),
        (resource.RLIMIT_MSGQUEUE, 0, 0),
    ]
    if limits.get("nproc") is not None:
        pairs.append((resource.RLIMIT_NPROC, limits["nproc"], limits["nproc"]))
    for which, soft, hard in pairs:
        _, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))


# An error's message crosses for diagnosis only: a 20 MB one must not turn the sample into a
# failure of the scorer (the test process prints it).
MAX_MESSAGE_CHARS = 2000


def _describe(error):
    try:
        message = str(error)
    except BaseException:  # noqa: BLE001 - the candidate's __str__ may do anything
        message = "<unprintable>"
    name = type(error).__name__
    message = message if type(message) is str else "<unprintable>"
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + f"... ({len(message)} characters)"
    return [name if type(name) is str else "Exception", message]


class Server:
    def __init__(self, in_fd, out_fd):
        self.in_fd, self.out_fd = in_fd, out_fd
        self.namespace = {"__name__": "solution", "__builtins__": __builtins__}
        self.objects = {}

    def handle_of(self, value):
        number = len(self.objects) + 1
        self.objects[number] = value
        return number

    def object(self, number):
        if number not in self.objects:
            raise _wire.WireError(f"no handle {number}")
        return self.objects[number]

    def value(self, wire):
        return _wire.decode(wire, self.object)

    def target(self, message):
        if "name" in message:
            name = message["name"]
            if type(name) is not str or name not in self.namespace:
                raise NameError(f"name {name!r} is not defined by the solution")
            return self.namespace[name]
        return self.object(message.get("h"))

    def answer(self, message):
        op = message.get("op")
        if op == "load":
            exec(compile(message["source"], "solution.py", "exec"), self.namespace)
            return None
        target = self.target(message)
        if op == "get":
            return target
        if op == "call":
            args = [self.value(a) for a in message["args"]]
            kwargs = {k: self.value(v) for k, v in message["kwargs"]}
            return target(*args, **kwargs)
        if op == "getattr":
            return getattr(target, message["attr"])
        if op == "setattr":
            setattr(target, message["attr"], self.value(message["value"]))
            return None
        if op == "iter":
            return iter(target)
        if op == "next":
            return next(target)
        if op == "len":
            return len(target)
        if op == "getitem":
            return target[self.value(message["key"])]
        if op == "contains":
            return self.value(message["item"]) in target
        if op == "bool":
            return bool(target)
        if op in ("repr", "str"):
            return (repr if op == "repr" else str)(target)
        raise _wire.WireError(f"unknown operation {op!r}")

    def serve(self):
        while True:
            try:
                message = _wire.receive(self.in_fd)
            except _wire.WireError:
                return
            try:
                reply = {"value": _wire.encode(self.answer(message), self.handle_of)}
            except StopIteration:
                reply = {"stop": True}
            except _wire.WireError as e:
                reply = {"raise": ["ProtocolError", str(e)]}
            except BaseException as e:  # noqa: BLE001 - everything the candidate raises is reported
                if isinstance(e, SystemExit):
                    reply = {"raise": ["SystemExit", "the solution exited"]}
                else:
                    reply = {"raise": _describe(e)}
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # noqa: BLE001
                pass
            nonce = message.get("n")  # the request's own nonce: the reply answers this request
            try:
                _wire.send(self.out_fd, {**reply, "re": nonce})
            except (_wire.WireError, OSError, ValueError):
                _wire.send(self.out_fd, {"raise": ["ValueError", "the result could not be sent"], "re": nonce})


def main():
    in_fd, out_fd, config = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    limit(config["limits"])
    sys.set_int_max_str_digits(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    if config.get("guard"):
        _sandbox_guard.install(os.getcwd())
    del config
    Server(in_fd, out_fd).serve()
    os._exit(0)


if __name__ == "__main__":
    main()
