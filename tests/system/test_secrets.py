"""No secret leaves in a message, and no key goes out before it is checked.

A hostile corpus of inputs that hold a canary key (a prompts file that is a link to
/proc/self/environ, a credentials file named .csv, a config that is one, records whose keys,
values, roles or answers are the key, a server that echoes the Authorization header) is
refused, each refusal naming its file; the canary is in none of them. And an audit whose
key variable, URL or second server is refused sends nothing: a server here counts requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from conftest import tiny_study
from tokenflip.cli.main import main
from tokenflip.core.excerpt import excerpt, keep_secret, redacted

CANARY = "sk-tfcanary-8f1d2c9e7a6b5d4c3b2a"
CANARY_VARIABLE = "TOKENFLIP_CANARY_API_KEY"
# What a canary looks like inside other content; every one must be masked.
SHAPES = [f"AWS_SECRET_ACCESS_KEY={CANARY}", f"Authorization: Bearer {CANARY}", f"http://user:{CANARY}@host/v1",
          f'{{"api_key": "{CANARY}"}}', f"password = {CANARY}", CANARY, f"({CANARY})", f"token {CANARY}"]


@pytest.mark.parametrize("text", SHAPES)
def test_an_excerpt_masks_every_credential_shape(text):
    assert "tfcanary" not in excerpt(text, 200) and "tfcanary" not in redacted(text)


def test_a_kept_secret_is_masked_whatever_its_shape_and_plain_text_is_kept():
    secret = "plainwordsecret"  # no credential shape at all: only keeping it masks it
    assert redacted(f"echo {secret}!") == f"echo {secret}!"
    keep_secret(secret)
    assert redacted(f"echo {secret}!") == "echo «redacted»!"
    assert excerpt("Name a prime.") == "'Name a prime.'" and excerpt("x" * 100).endswith("(100 characters)")


# The corpus: (file name, content or a link target); each a prompts file a study reads.
def _corpus(tmp_path):
    credentials = f"AWS_ACCESS_KEY_ID=AKIAEXAMPLE\nAWS_SECRET_ACCESS_KEY={CANARY}\n"
    cases = {
        "environ.jsonl": "/proc/self/environ", "environ.csv": "/proc/self/environ",
        "environ.json": "/proc/self/environ", "environ.parquet": "/proc/self/environ",
        "creds.csv": credentials, "creds.jsonl": credentials, "creds.json": credentials,
        "header.csv": f"prompt,,{CANARY}\nhi,a,b\n",
        "key.jsonl": json.dumps({"prompt": "hi", CANARY: 1}) + "\n",
        "value.jsonl": json.dumps({"prompt": {"token": CANARY}}) + "\n",
        "id.jsonl": json.dumps({"prompt": "hi", "id": CANARY * 10}) + "\n",
        "role.jsonl": json.dumps({"messages": [{"role": CANARY, "content": "hi"}]}) + "\n",
        "turnkey.jsonl": json.dumps({"messages": [{"role": "user", "content": "hi", CANARY: "x"}]}) + "\n",
        "nul.jsonl": json.dumps({"prompt": "\u0000" + CANARY}) + "\n",
        "record.jsonl": json.dumps(f"password={CANARY}") + "\n",
        "answer.jsonl": json.dumps({"prompt": "q", "answer": f"token={CANARY}"}) + "\n",
    }
    paths = []
    for name, content in cases.items():
        path = tmp_path / name
        if content.startswith("/proc/"):
            path.symlink_to(content)
        else:
            path.write_text(content)
        paths.append(path)
    return paths


def test_no_refusal_of_the_hostile_corpus_quotes_the_canary(tmp_path):
    """Each file read in a process whose environment holds the canary (so /proc/self/environ
    does): every one refused, naming its file, the canary in no message."""
    from tokenflip.run.benchmarks import BenchmarkError, build_benchmark

    paths = _corpus(tmp_path)
    script = (
        "import json, sys\n"
        "from tokenflip.run.benchmarks import build_benchmark\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    scorer = 'numeric' if 'answer' in path else 'none'\n"
        "    try:\n"
        "        build_benchmark('mine', {'kind': 'prompts', 'order': 'source', 'scorer': scorer,\n"
        "                                 'source': {'path': path}}).items()\n"
        "        out[path] = None\n"
        "    except Exception as exc:\n"
        "        out[path] = f'{type(exc).__name__}: {exc}'\n"
        "print(json.dumps(out))\n")
    env = {**os.environ, CANARY_VARIABLE: CANARY}
    done = subprocess.run([sys.executable, "-c", script, *map(str, paths)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    messages = json.loads(done.stdout)
    assert BenchmarkError and build_benchmark  # the in-process names the script uses
    for path in paths:
        message = messages[str(path)]
        assert message is not None and message.startswith("BenchmarkError: "), (path.name, message)
        assert path.name in message, message
        assert "tfcanary" not in message and CANARY_VARIABLE + "=" + CANARY[:6] not in message, message
    assert "kernel's /proc tree" in messages[str(tmp_path / "environ.csv")]


def test_plan_refuses_a_config_or_prompts_file_that_is_a_secret_without_quoting_it(tmp_path):
    environ = tmp_path / "environ.yaml"
    environ.symlink_to("/proc/self/environ")
    creds = tmp_path / "creds.yaml"
    creds.write_text(f"aws_secret_access_key: [{CANARY}\n")  # not YAML: PyYAML would print this line
    prompts = tmp_path / "prompts.csv"
    prompts.write_text(f"AWS_SECRET_ACCESS_KEY={CANARY},,\n")
    config = tmp_path / "study.yaml"
    study = tiny_study()
    study["benchmarks"] = {"mine": {"kind": "prompts", "source": {"path": str(prompts)}}}
    config.write_text(yaml.safe_dump(study))
    env = {**os.environ, CANARY_VARIABLE: CANARY}
    for path, names in ((environ, "environ.yaml"), (creds, "creds.yaml"), (config, "prompts.csv")):
        done = subprocess.run([sys.executable, "-m", "tokenflip", "plan", "--config", str(path)], env=env,
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode in (1, 2), done.stderr
        assert names in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert "tfcanary" not in done.stderr + done.stdout, done.stderr


class RecordingServer:
    """An HTTP server that answers 401 to everything and keeps what reached it."""

    def __init__(self):
        self.requests: list[tuple[str, str, str | None]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _record(self):
                server.requests.append((self.command, self.path, self.headers.get("authorization")))
                payload = b'{"error": "no"}'
                self.send_response(401)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _record

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def recording():
    server = RecordingServer()
    yield server
    server.close()


@pytest.mark.parametrize("how", ["not-a-key", "unset", "url-password", "against-not-a-key", "against-unset"])
def test_an_audit_sends_nothing_before_every_key_and_url_is_checked(recording, tmp_path, monkeypatch, capsys, how):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GOOD_API_KEY", CANARY)
    monkeypatch.delenv("UNSET_API_KEY", raising=False)
    url, extra = recording.url, []
    if how == "not-a-key":
        extra = ["--api-key-env", "HOME"]
    elif how == "unset":
        extra = ["--api-key-env", "UNSET_API_KEY"]
    elif how == "url-password":
        url = recording.url.replace("http://", f"http://user:{CANARY}@")
    elif how == "against-not-a-key":
        extra = ["--api-key-env", "GOOD_API_KEY", "--against", recording.url, "--against-key-env", "PATH"]
    else:
        extra = ["--api-key-env", "GOOD_API_KEY", "--against", recording.url, "--against-key-env", "UNSET_API_KEY"]
    try:
        code = main(["audit", url, "--model", "m", "--write-only", *extra])
    except SystemExit as exit_:  # argparse refuses a URL with a password as a usage error
        code = exit_.code
    err = capsys.readouterr().err
    assert code in (1, 2) and recording.requests == [], (code, recording.requests, err)
    assert "tfcanary" not in err and "Traceback" not in err
    named = {"not-a-key": "$HOME", "unset": "$UNSET_API_KEY", "url-password": "user name or password",
             "against-not-a-key": "$PATH", "against-unset": "$UNSET_API_KEY"}[how]
    assert named in err, err


@pytest.mark.parametrize("entry, named", [
    ({"api_key_env": "HOME"}, "endpoints.prod.api_key_env: $HOME is not a key for this server"),
    ({"api_key_env": "AWS_SECRET_ACCESS_KEY"}, "endpoints.prod.api_key_env: $AWS_SECRET_ACCESS_KEY is not a key"),
    ({"url_userinfo": True}, "endpoints.prod.url: it holds a user name or password"),
])
def test_a_study_whose_endpoint_entry_would_send_a_secret_is_refused_before_any_request(recording, entry, named):
    from tokenflip.study import config as cfg

    url = recording.url.replace("http://", f"http://user:{CANARY}@") if entry.pop("url_userinfo", False) \
        else recording.url
    study = tiny_study()
    study["endpoints"] = {"prod": {"url": url, "model": "m", "server": "vllm", **entry}}
    study["grids"] = [{"precision": ["fp32"], "cache": ["on"], "batch_size": [1], "engine": ["prod"]}]
    study["comparisons"], study["probes"] = [], {}
    with pytest.raises(cfg.ConfigError) as err:
        cfg.validate(study, source="study.yaml")
    assert named in str(err.value) and "tfcanary" not in str(err.value), str(err.value)
    assert recording.requests == []
