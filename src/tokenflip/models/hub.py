"""Hub models checked before the first job, without downloading weights.

A model from the Hugging Face hub fails in `prepare_model` when there is no network and no
cached copy, when its repository is gated and there is no token (or its licence was not
accepted), or when its revision does not exist. Each of these can be known before any job
runs, from the hub's metadata or the local cache alone; the message names the model, the
cause and the fix. Models already prepared under resources/models/ are not checked: no job
reaches the hub for them (what compute nodes without network rely on). Before any of that,
an id is checked against the hub's own rules (`id_problems`, part of config validation): a
path, a URL or a flag is no repository, and would otherwise plan and then fail as a hub that
cannot be reached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenflip.core.inputs import shown
from tokenflip.core.layout import MODELS_DIR


def is_local_dir(model_id: str) -> bool:
    """Whether an `hf` model's id names a local directory (a checkpoint on disk) rather
    than a hub repository; False for a name no directory can have (too long, a NUL)."""
    try:
        return Path(model_id).is_dir()
    except (OSError, ValueError):
        return False


def hub_id_problem(repo_id: str) -> str | None:
    """Why `repo_id` cannot name a Hugging Face repository, by the hub's own rules
    (`huggingface_hub.utils.validate_repo_id`: `name` or `namespace/name`, at most 96
    characters of letters, digits, '-', '_' and '.', no '--' or '..', not ending in '.git');
    None where it can. A path, a URL, a flag or an id too long is refused before any job
    (it would plan, then fail as "the hub cannot be reached" or with "File name too long")."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        rule = str(exc).replace(f": '{repo_id}'", "").replace(" Use `repo_type` argument if needed.", "")
        return f"{shown(repo_id)} is not an id the Hugging Face hub can have ({' '.join(rule.split())})"
    return None


def id_problem(model_id: str) -> str | None:
    """Why an `hf` model's id can be neither a local directory nor a hub repository
    (`hub_id_problem`); None where it can be one."""
    if is_local_dir(model_id):
        return None
    why = hub_id_problem(model_id)
    return f"{why}, nor a local directory; give `namespace/name` as the hub shows it, or an existing directory" \
        if why else None


def id_problems(config: dict[str, Any]):
    """`models.NAME.id: why` for every `hf` model of a config whose id can be neither a
    local directory nor a hub repository."""
    for name, spec in config["models"].items():
        if spec.get("source") == "hf" and (why := id_problem(spec["id"])):
            yield f"models.{name}.id: {why}"
        if spec.get("source") == "hf" and spec.get("revision") is not None \
                and (why := revision_problem(str(spec["revision"]))):
            yield f"models.{name}.revision: {why}"


def revision_problem(revision: str) -> str | None:
    """Why `revision` can name no branch, tag or commit (git's ref-name rules): a path that
    climbs out ("../"), a control character or space, or a character git refuses."""
    bad = sorted({c for c in revision if ord(c) < 32 or ord(c) == 127 or c in " ~^:?*[\\"})
    reasons = [", ".join(repr(c) for c in bad)] if bad else []
    reasons += [why for why, found in (("'..'", ".." in revision), ("'@{'", "@{" in revision),
                                       ("'//'", "//" in revision),
                                       ("a leading '/', '-' or '.'", revision.startswith(("/", "-", "."))),
                                       ("a trailing '/', '.' or '.lock'", revision.endswith(("/", ".", ".lock"))),
                                       ("over 255 characters", len(revision) > 255)) if found]
    if reasons:
        return (f"{revision[:60]!r} is not a branch, tag or commit name ({'; '.join(reasons)}: git refuses it); use "
                f"the repository's branch or tag, or a 40-character commit hash")
    return None


PREPARE_ON_A_LOGIN_NODE = ("on a machine with network (a login node), run `snakemake --until prepare_model "
                           "--cores 1 --configfile <config>` in this directory: it prepares every model into "
                           "resources/models/, which jobs without network then use")


def _label(name: str, spec: dict[str, Any]) -> str:
    revision = f" at revision {spec['revision']!r}" if spec.get("revision") else ""
    return f"model {name!r} ({spec['id']}{revision})"


def _cached(spec: dict[str, Any]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        return isinstance(try_to_load_from_cache(spec["id"], "config.json", revision=spec.get("revision")), str)
    except Exception:  # noqa: BLE001 - an id the cache cannot hold is not cached
        return False


def _gated(repo: str) -> str:
    return (f"it is a gated repository: it needs a Hugging Face token (`huggingface-cli login`, or HF_TOKEN) of an "
            f"account that has accepted its licence at https://huggingface.co/{repo}")


def check_model(name: str, spec: dict[str, Any], timeout: float = 15.0) -> str | None:
    """What stops this hub model from being prepared here, with the fix (None: nothing)."""
    from huggingface_hub import HfApi, auth_check, constants, get_token
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    label, repo = _label(name, spec), spec["id"]
    if constants.HF_HUB_OFFLINE:
        if _cached(spec):
            return None
        return (f"{label}: HF_HUB_OFFLINE is set and the Hugging Face cache ({constants.HF_HUB_CACHE}) has no copy "
                f"of it. Fix: {PREPARE_ON_A_LOGIN_NODE}; or fill the cache there (`huggingface-cli download {repo}`) "
                f"and point HF_HOME at it here")
    token = get_token()
    try:
        info = HfApi().model_info(repo, revision=spec.get("revision"), token=token, timeout=timeout)
        if info.gated and token:
            auth_check(repo, token=token)
    except GatedRepoError:
        return f"{label}: {_gated(repo)}; this token's account has no access yet. Fix: accept the licence there"
    except RevisionNotFoundError:
        return (f"{label}: the revision does not exist. Fix: a branch, tag or commit listed at "
                f"https://huggingface.co/{repo}/commits/main")
    except RepositoryNotFoundError:
        return (f"{label}: no such repository on the hub, or a private one this machine's token cannot see. "
                f"Fix: check the id; for a private repository, `huggingface-cli login` or HF_TOKEN")
    except Exception as exc:  # noqa: BLE001 - no network, a proxy, a timeout: the cause is in the message
        if _cached(spec):
            return None
        cause = " ".join(str(exc).split())[:200]
        return (f"{label}: the hub cannot be reached ({type(exc).__name__}: {cause}) and the Hugging Face cache "
                f"({constants.HF_HUB_CACHE}) has no copy. Fix: {PREPARE_ON_A_LOGIN_NODE}")
    if info.gated and not token:
        return f"{label}: {_gated(repo)}; this machine has no token. Fix: log in, and accept the licence"
    return None


def hub_problems(config: dict[str, Any], models_dir: str | Path = MODELS_DIR) -> list[str]:
    """One message per hub model of the config that could not be prepared here."""
    problems = []
    for name, spec in config["models"].items():
        if spec.get("source") != "hf" or is_local_dir(spec["id"]):
            continue
        if (Path(models_dir) / name / "model.json").is_file():
            continue
        problem = check_model(name, spec)
        if problem:
            problems.append(problem)
    return problems
