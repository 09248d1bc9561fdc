"""Parquet files of cells and pairs: schema, provenance metadata, atomic writes.

One row per prompt; per-step data in list columns; provenance as JSON in the schema
metadata under the key `tokenflip`. A file is written to a temporary name in the same
directory and renamed, so a killed job never leaves a file that looks complete; the hidden
temporary a killed writer leaves behind (`.<name>.XXXXXXXX.tmp`) is removed by the next
write of the same file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenflip.core.inputs import loads_json
from tokenflip.core.scheduler import exit_if_orphaned

SCHEMA_VERSION = 2
META_KEY = b"tokenflip"


class StorageError(ValueError):
    pass


def cell_schema(k: int) -> pa.Schema:
    step_k_int = pa.list_(pa.list_(pa.int32(), k))
    step_k_float = pa.list_(pa.list_(pa.float32(), k))
    return pa.schema([
        pa.field("prompt_index", pa.int32(), nullable=False),
        pa.field("prompt_id", pa.string(), nullable=False),
        pa.field("batch_index", pa.int32(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("token_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("top_ids", step_k_int, nullable=False),
        pa.field("top_logits", step_k_float, nullable=False),
        pa.field("margin", pa.list_(pa.float32()), nullable=False),
        pa.field("logsumexp", pa.list_(pa.float32()), nullable=False),
        pa.field("entropy", pa.list_(pa.float32()), nullable=False),
        pa.field("intervened", pa.list_(pa.bool_()), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("gold", pa.string()),
        pa.field("extracted", pa.string()),
        pa.field("correct", pa.bool_()),
        pa.field("answer_rule", pa.string(), nullable=False),
        pa.field("verdict", pa.string(), nullable=False),
        pa.field("latency_s", pa.float64(), nullable=False),
    ])


def _fixed_lists(rows: list[np.ndarray], k: int, dtype: pa.DataType) -> pa.Array:
    """Per-prompt [steps, k] arrays → list<fixed_size_list<k>> without Python loops per value."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    flat = np.concatenate([np.asarray(r).reshape(-1, k) for r in rows]) if rows else np.zeros((0, k))
    values = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), type=dtype), k)
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def cell_table(records: list[dict[str, Any]], k: int) -> pa.Table:
    schema = cell_schema(k)
    columns = {}
    for f in schema:
        if f.name == "top_ids":
            columns[f.name] = _fixed_lists([r["top_ids"] for r in records], k, pa.int32())
        elif f.name == "top_logits":
            columns[f.name] = _fixed_lists([r["top_logits"] for r in records], k, pa.float32())
        else:
            columns[f.name] = pa.array([r[f.name] for r in records], type=f.type)
    return pa.Table.from_pydict(columns, schema=schema)


def token_stream_digest(table: pa.Table) -> str:
    """sha256 over (prompt id, prompt ids, generated ids) of every row in prompt order:
    equal digests mean bitwise-identical token streams, across machines too."""
    h = hashlib.sha256()
    order = np.argsort(np.asarray(table.column("prompt_index")))
    prompt_ids = table.column("prompt_id").to_pylist()
    prompts = table.column("prompt_ids").to_pylist()
    tokens = table.column("token_ids").to_pylist()
    for i in order:
        h.update(prompt_ids[i].encode() + b"\0")
        h.update(np.asarray(prompts[i], dtype="<i4").tobytes() + b"\1")
        h.update(np.asarray(tokens[i], dtype="<i4").tobytes() + b"\2")
    return h.hexdigest()


def logits_digest(table: pa.Table) -> str:
    """sha256 over every recorded top-k logit (bitwise), in prompt order."""
    h = hashlib.sha256()
    order = np.argsort(np.asarray(table.column("prompt_index")))
    col = table.column("top_logits")
    for i in order:
        values = col[int(i)].values.flatten()
        h.update(np.asarray(values.to_numpy(zero_copy_only=False), dtype="<f4").tobytes() + b"\0")
    return h.hexdigest()


def current_umask() -> int:
    """The process's umask (reading it means setting it; set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | Path) -> None:
    """Give `path` (and, for a directory, everything in it) the mode the user's umask gives a new
    file or directory. What is written through a private temporary (mkstemp and mkdtemp create
    0600 and 0700) or by a library that writes its files 0600 (safetensors) would otherwise stay
    unreadable to a group sharing a project directory (or a web server publishing reports)."""
    mask = current_umask()
    root = Path(path)
    for item in [root, *(root.rglob("*") if root.is_dir() and not root.is_symlink() else ())]:
        if not item.is_symlink():
            os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)


def _type_tag(kind: pa.DataType) -> str:
    """A type's structure without the names Parquet may change on a round trip (a list's
    item field is read back as `element`) or its large/small variants."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{_type_tag(kind.value_type)}>"
    if pa.types.is_fixed_size_list(kind):
        return f"list[{kind.list_size}]<{_type_tag(kind.value_type)}>"
    if pa.types.is_large_string(kind) or pa.types.is_string(kind):
        return "string"
    return str(kind)


def _hash_array(h, array: pa.Array) -> None:
    """Feed one column's type, validity and values (bitwise) into `h`; list offsets are taken
    relative to the first, so that the same values hash the same however they are sliced."""
    kind = array.type
    h.update(_type_tag(kind).encode() + b"\0" + len(array).to_bytes(8, "little"))
    if array.null_count:
        h.update(np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=np.uint8).tobytes())
    if pa.types.is_null(kind):
        return
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = np.asarray(array.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        h.update((offsets - offsets[0]).tobytes())
        _hash_array(h, array.flatten())
    elif pa.types.is_fixed_size_list(kind):
        _hash_array(h, array.flatten())
    elif pa.types.is_boolean(kind):
        h.update(np.asarray(array.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.uint8).tobytes())
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        h.update(np.ascontiguousarray(array.fill_null(0).to_numpy(zero_copy_only=False)).tobytes())
    else:  # strings and anything else: their values, each with its length
        for value in array.to_pylist():
            data = json.dumps(value, sort_keys=True, default=str).encode()
            h.update(len(data).to_bytes(8, "little") + data)


def table_digest(table: pa.Table) -> str:
    """sha256 over every column of a table (names, types, validity and values, bitwise), in
    stored row order: any edit of any value of a result file changes it."""
    h = hashlib.sha256()
    for name in table.column_names:
        h.update(name.encode() + b"\0")
        _hash_array(h, table.column(name).combine_chunks())
    return h.hexdigest()


def _temporary_prefix(path: Path) -> str:
    return f".{path.name}."


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Delete the temporaries that earlier, killed writes of `path` left beside it.

    `write_table` names its temporary `.<name>.<8 random chars>.tmp` (`tempfile.mkstemp`);
    a process killed with SIGKILL (or a node that died) cannot remove it. Only this
    target's temporaries match, never another file's (`.a.parquet.x.parquet.<rand>.tmp`
    belongs to `a.parquet.x.parquet`). Snakemake never runs two jobs with the same output
    at once, so a temporary of this target found here is a leftover, not a live write.
    """
    path = Path(path)
    own = re.compile(re.escape(_temporary_prefix(path)) + r"[a-z0-9_]{8}\.tmp")
    removed = []
    if path.parent.is_dir():
        for candidate in path.parent.iterdir():
            if own.fullmatch(candidate.name) and candidate.is_file():
                candidate.unlink(missing_ok=True)
                removed.append(candidate)
    return removed


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside `path`; when the block ends without error, the file is
    synced and renamed into place (a killed writer leaves no file that looks complete, and a
    job whose scheduler died leaves none at all). Temporaries that killed earlier writes of
    the same file left behind are removed first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    follow_umask(tmp)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        exit_if_orphaned(lambda: Path(tmp).unlink(missing_ok=True))  # an orphaned job leaves no result
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def metadata_digest(meta: dict[str, Any]) -> str:
    """sha256 over a file's tokenflip metadata (everything but this digest), in canonical JSON:
    what a reader decides from the metadata (a summary's declared gate, say) is covered too."""
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def write_table(table: pa.Table, path: str | Path, metadata: dict[str, Any]) -> None:
    """Write atomically with `metadata` as JSON in the schema metadata, with digests of the
    table and of the metadata itself."""
    meta = dict(table.schema.metadata or {})
    body = json.loads(json.dumps({"schema_version": SCHEMA_VERSION, **metadata, "table_sha256": table_digest(table)},
                                 sort_keys=True, default=str))
    meta[META_KEY] = json.dumps({**body, "meta_sha256": metadata_digest(body)}, sort_keys=True).encode()
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        # zstd-3: the smallest of the fast codecs on these list columns (1.1-1.2x smaller than
        # snappy, about 135 bytes per generated token at k=16; perf/storage.py).
        # Page checksums: a corrupt data page is an error on read, not silently wrong values.
        pq.write_table(table, tmp, compression="zstd", compression_level=3, write_page_checksum=True)



def write_cell_file(table: pa.Table, out_path: str | Path, metadata: dict[str, Any]) -> dict[str, Any]:
    """A cell's table written with the digests of its data, which every reader recomputes."""
    metadata = {**metadata, "token_stream_sha256": token_stream_digest(table),
                "logits_sha256": logits_digest(table)}
    write_table(table, out_path, metadata)
    return metadata


def write_json(path: str | Path, data: Any) -> None:
    """Write a small JSON record atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))


def read_metadata(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        schema = pq.read_schema(path)
    except FileNotFoundError:
        raise StorageError(f"{path}: file not found") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise StorageError(f"{path}: not a readable Parquet file ({exc})") from None
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise StorageError(f"{path}: no tokenflip provenance in the Parquet metadata")
    try:
        meta = loads_json(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw, "its provenance", finite=False)
    except ValueError as exc:
        raise StorageError(f"{path}: its tokenflip provenance is not what tokenflip writes ({exc})") from None
    if not isinstance(meta, dict):
        raise StorageError(f"{path}: its tokenflip provenance is not a mapping")
    recorded = meta.get("meta_sha256")  # files of an older tokenflip have none (the gate refuses those)
    if recorded is not None and recorded != metadata_digest(meta):
        raise StorageError(f"{path}: its metadata do not match the recorded meta_sha256: an edited or corrupt file")
    return meta


def read_table(path: str | Path, columns: list[str] | None = None,
               kind: str | None = None) -> tuple[pa.Table, dict[str, Any]]:
    """The table and its provenance; with `kind`, refuse a file of another kind (a pair
    file where a cell file is expected, say). Every column is checked against the
    table_sha256 recorded when the file was written: an edited value (a `correct`, a
    `margin`, a pair's `identical`) is refused naming the file, never summarised."""
    meta = read_metadata(path)
    if kind is not None and meta.get("kind") != kind:
        raise StorageError(f"{path}: a {meta.get('kind')!r} file, expected a {kind!r} file")
    try:
        # The file read alone (not pyarrow's datasets, which a job would import for half a second).
        parquet = pq.ParquetFile(path, page_checksum_verification=True)
        absent = [c for c in columns or [] if c not in parquet.schema_arrow.names]
        if absent:  # a missing column is an error here (ParquetFile.read would leave it out)
            raise pa.ArrowInvalid(f"no column {absent[0]!r}")
        table = parquet.read(columns=columns)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StorageError(f"{path}: corrupt or truncated Parquet file ({type(exc).__name__}: {exc})") from None
    if columns is None:
        recorded = meta.get("table_sha256")
        if recorded is None:
            raise StorageError(f"{path}: no table_sha256 in its provenance (written by an older tokenflip, or "
                               "not by tokenflip): make it again")
        actual = table_digest(table)
        if actual != recorded:
            raise StorageError(f"{path}: the data do not match the recorded table_sha256 (recorded {recorded[:12]}…, "
                               f"data {actual[:12]}…): an edited or corrupt file")
    return table, meta


def read_cell(path: str | Path) -> tuple[pa.Table, dict[str, Any]]:
    """A whole cell file, every data page decoded, with its digests recomputed from the
    data: a file whose pages are corrupt, or whose data no longer match the digests
    recorded when it was written, is refused naming the file. Verdicts that rest on a
    digest (identical, done) must come from here, never from the metadata alone."""
    table, meta = read_table(path, kind="cell")
    for key, digest in (("token_stream_sha256", token_stream_digest), ("logits_sha256", logits_digest)):
        try:
            actual = digest(table)
        except (pa.ArrowException, KeyError, ValueError) as exc:
            raise StorageError(f"{path}: cannot recompute {key} ({type(exc).__name__}: {exc})") from None
        if actual != meta.get(key):
            raise StorageError(f"{path}: the data do not match the recorded {key} (recorded "
                               f"{str(meta.get(key))[:12]}…, data {actual[:12]}…): corrupt or edited file")
    return table, meta
