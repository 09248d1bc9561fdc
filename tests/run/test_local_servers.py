"""A server tokenflip starts (`tokenflip serve`, the endpoint tests) ends with the process that
started it: a stopped test run or a killed `serve` leaves no server holding a port and a core."""

from __future__ import annotations

import os
import subprocess
import sys
import time

STARTER = """
import sys, time
from pathlib import Path
from tokenflip.run.engines.local_servers import Server

server = Server([sys.executable, "-c", "import time; time.sleep(600)"], "http://127.0.0.1:9/v1", "x",
                Path(sys.argv[1]))
server._lists_name = lambda: True  # a stand-in server: "ready" once started
server.start()
print(server.process.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_server_ends_when_the_process_that_started_it_is_killed(tmp_path):
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path / "server.log")], stdout=subprocess.PIPE,
                               text=True)
    try:
        server = int(starter.stdout.readline())
        assert _alive(server)
        starter.kill()  # SIGKILL: no cleanup of its own runs
        starter.wait()
        deadline = time.monotonic() + 10
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(server), "the server outlived the process that started it"
    finally:
        starter.kill()
        if "server" in locals() and _alive(server):
            os.kill(server, 9)
