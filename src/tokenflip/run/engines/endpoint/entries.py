"""What an `endpoints` entry may say, checked before any job: a cell's name owns the fields
of its requests (the model, the prompt, the tokens asked, the decoding), so `extra_body`
cannot set them; credentials never stand in a URL (it is recorded with every cell, the study
file and the report) and come only from a variable that holds a key for this server, never
from the environment's other variables or another service's token."""

from __future__ import annotations

import re
from typing import Any, Iterator
from urllib.parse import urlsplit

from tokenflip.core.excerpt import excerpt

# Request fields the cell's settings own (`engine.request_fields` and the prompt's own), and
# those that would change how an answer is read (several choices, a stream, the prompt echoed).
OWNED_FIELDS = frozenset({
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "min_tokens", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "stop_token_ids", "logprobs", "top_logprobs", "prompt_logprobs",
    "logit_bias", "n", "best_of", "stream", "stream_options", "echo", "ignore_eos", "cache_salt",
    "return_tokens_as_token_ids", "use_beam_search", "response_format", "guided_json", "guided_regex",
    "guided_choice", "guided_grammar", "structured_outputs", "tools", "tool_choice", "suffix"})

# Variables that hold no key for an inference server, and other services' credentials: their
# values would be sent to the configured host.
NOT_KEYS = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "LANG", "TERM", "HOSTNAME", "TMPDIR",
    "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "SSH_AUTH_SOCK", "DISPLAY", "MAIL",
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN", "GITHUB_TOKEN", "GH_TOKEN", "GITLAB_TOKEN",
    "CI_JOB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CLIENT_SECRET", "NPM_TOKEN", "PYPI_TOKEN", "TWINE_PASSWORD",
    "DOCKER_PASSWORD", "SLACK_TOKEN", "WANDB_API_KEY"})
KEY_NAME = re.compile(r"(KEY|TOKEN|SECRET)", re.IGNORECASE)


def entry_problems(name: str, spec: dict[str, Any]) -> Iterator[str]:
    """Why endpoint entry `name` may not be used as written, each reason naming its key."""
    where = f"endpoints.{name}"
    url = urlsplit(str(spec.get("url", "")))
    if url.username is not None or url.password is not None:
        yield (f"{where}.url: it holds a user name or password (…@{url.hostname}): a URL is recorded with every "
               f"cell, the study file and the report; put the key in an environment variable and name that "
               f"variable in {where}.api_key_env")
    if url.query or url.fragment:
        yield f"{where}.url: a base URL takes no query or fragment ({excerpt(spec['url'])})"
    owned = sorted(set(spec.get("extra_body") or {}) & OWNED_FIELDS)
    if owned:
        yield (f"{where}.extra_body: {owned} are set by each cell's own settings (its model, prompts, tokens, "
               f"decoding and logprobs): a cell named greedy must be sent greedy; set them through the config's "
               f"axes and benchmarks instead")
    key = spec.get("api_key_env")
    if key and (key.upper() in NOT_KEYS or key.upper().startswith(("AWS_", "GOOGLE_", "AZURE_"))
                or not KEY_NAME.search(key)):
        yield (f"{where}.api_key_env: ${key} is not a key for this server (its value would be sent to "
               f"{url.hostname}): name a variable that holds only this server's key, such as "
               f"{name.upper()}_API_KEY")
