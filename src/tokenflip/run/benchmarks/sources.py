"""Where a benchmark's records come from: the Hugging Face hub, a local JSONL/JSON/CSV/Parquet
file, or a data file shipped in an installed package; one loader and one error for all."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenflip.core.excerpt import excerpt
from tokenflip.core.inputs import InputError, kernel_file, loads_json
from tokenflip.core.literals import literal_problems
from tokenflip.models.hub import hub_id_problem
from tokenflip.run.benchmarks.errors import BenchmarkError

__all__ = ["Source", "parse_source", "check_local", "load_records", "located_records", "HUB_KEYS", "PATH_KEYS",
           "PACKAGE_KEYS"]

# The most a data file may hold, decompressed: benchmark files are a few MiB (GSM8K's train
# split, the largest read here, is 4 MiB), so a bigger one (a gzip bomb) is refused before
# it is read whole.
MAX_DATA_BYTES = 64 * 2**20
# The most records a data file may hold: a benchmark's test split has thousands (MATH's
# 12,500 the most of those read here), a team's sample of traffic no more than this.
MAX_RECORDS = 100_000
PATH_KEYS = frozenset({"path"})
HUB_KEYS = frozenset({"hub", "config", "split", "revision"})
PACKAGE_KEYS = frozenset({"package", "file"})


@dataclass(frozen=True)
class Source:
    """One of: a local `path`; a `hub` dataset id (config, split, revision); or a `file` inside
    the installed distribution `package`."""

    path: Path | None = None
    hub: str | None = None
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    package: str | None = None
    file: str | None = None

    def label(self) -> str:
        """The source as tried, for error messages."""
        if self.path is not None:
            return str(self.path)
        if self.package is not None:
            return f"package {self.package!r} file {self.file!r}"
        return f"{self.hub}@{self.revision or 'unpinned'} (config {self.config!r}, split {self.split!r})"

    def package_file(self) -> Path:
        """The path of `file` inside the installed distribution `package`."""
        from importlib import metadata

        try:
            dist = metadata.distribution(self.package)
        except metadata.PackageNotFoundError as e:
            raise FileNotFoundError(f"package {self.package!r} is not installed") from e
        path = Path(str(dist.locate_file(self.file)))
        if not path.is_file():
            raise FileNotFoundError(f"{self.file!r} is not in package {self.package!r} {dist.version}")
        return path

    def describe(self) -> dict[str, Any]:
        """Provenance: path/package file with sha256 (and package version), or the hub coordinates."""
        if self.path is not None:
            return {"path": str(self.path), "sha256": _sha256(self.path)}
        if self.package is not None:
            from importlib import metadata

            path = self.package_file()
            return {"package": self.package, "version": metadata.version(self.package), "file": self.file,
                    "sha256": _sha256(path)}
        return {"hub": self.hub, "config": self.config, "split": self.split, "revision": self.revision}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_source(where: str, spec: Any, default: Source) -> Source:
    """The Source a config's `source:` mapping names; omitted keys of the same kind come from
    `default`. `where` prefixes error messages, e.g. "benchmark 'he' (humaneval)"."""
    if spec is None:
        return default
    if not isinstance(spec, dict):
        raise BenchmarkError(f"{where}: source must be a mapping, got {excerpt(spec)}")
    keys = set(spec)
    unknown = sorted(keys - PATH_KEYS - HUB_KEYS - PACKAGE_KEYS)
    if unknown:
        allowed = sorted(PATH_KEYS | HUB_KEYS | PACKAGE_KEYS)
        raise BenchmarkError(f"{where}: unknown source key(s) {unknown}; allowed: {allowed}")
    kinds = [name for name, group in (("path", PATH_KEYS), ("hub", HUB_KEYS), ("package", PACKAGE_KEYS))
             if keys & group]
    if len(kinds) != 1:
        raise BenchmarkError(f"{where}: source must give exactly one of a path, hub keys or a package, got {excerpt(spec, 120)}")
    if kinds == ["path"]:
        return Source(path=Path(spec["path"]))
    if kinds == ["package"]:
        package = spec.get("package", default.package)
        file = spec.get("file", default.file if package == default.package else None)
        if not package or not file:
            raise BenchmarkError(f"{where}: a package source needs both 'package' and 'file'")
        return Source(package=package, file=file)
    hub = spec.get("hub", default.hub)
    if not hub:
        raise BenchmarkError(f"{where}: a hub source needs 'hub' (a dataset id)")
    if why := hub_id_problem(hub):
        raise BenchmarkError(f"{where}: source.hub: {why}")
    same = hub == default.hub
    return Source(
        hub=hub,
        config=spec.get("config", default.config if same else None),
        split=spec.get("split", default.split if same else None),
        revision=spec.get("revision", default.revision if same else None),
    )


def check_local(where: str, source: Source) -> None:
    """Fail early, with the source named, if a local path or package file is missing."""
    if source.path is not None and not source.path.is_file():
        raise BenchmarkError(f"{where}: local file not found: {source.path}")
    if source.path is not None and (tree := kernel_file(source.path)):
        raise BenchmarkError(f"{where}: {source.path} is a file of the kernel's {tree} tree, not a data file")
    if source.package is not None:
        try:
            source.package_file()
        except FileNotFoundError as e:
            raise BenchmarkError(f"{where}: cannot load {source.label()}: {e}") from e


def _too_large(label: str, size: int | str) -> BenchmarkError:
    return BenchmarkError(f"{label}: holds {size} bytes, more than the {MAX_DATA_BYTES} (64 MiB) a benchmark data "
                          f"file may hold decompressed")


def _read_bytes(path: Path, label: str) -> bytes:
    """The file's bytes, decompressed if gzip, never more than MAX_DATA_BYTES of them."""
    if path.stat().st_size > MAX_DATA_BYTES:
        raise _too_large(label, path.stat().st_size)
    with (gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")) as fh:
        raw = fh.read(MAX_DATA_BYTES + 1)
    if len(raw) > MAX_DATA_BYTES:
        raise _too_large(label, f"over {MAX_DATA_BYTES}")
    return raw


def _too_many(label: str, count: int | str, most: int) -> BenchmarkError:
    return BenchmarkError(f"{label}: holds {count} records, more than the {most:,} a benchmark file may hold "
                          f"(split it, or sample it)")


def _read_parquet(path: Path, label: str, most: int) -> list[dict]:
    """The table's rows, if its footer's row count is within `most`, its uncompressed pages
    within MAX_DATA_BYTES, and its values as Python objects too: text columns are read
    dictionary-encoded, so a few repeated kilobytes that would expand to gigabytes are
    measured before they are materialised."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    raw = _read_bytes(path, label)
    file = pq.ParquetFile(io.BytesIO(raw))
    meta = file.metadata
    if meta.num_rows > most:
        raise _too_many(label, f"{meta.num_rows:,}", most)
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    if size > MAX_DATA_BYTES:
        raise _too_large(label, size)
    texts = [f.name for f in file.schema_arrow if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
             or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
    # A few rows at a time, each batch measured as it is read: a nested column (a `messages`
    # list) cannot be read dictionary-encoded, so it is never decoded more than a batch past
    # the bound.
    batches, expanded = [], 0
    for batch in pq.ParquetFile(io.BytesIO(raw), read_dictionary=texts).iter_batches(batch_size=16):
        for column in batch.columns:
            expanded += (pc.sum(pc.take(pc.binary_length(column.dictionary), column.indices)).as_py() or 0
                         if pa.types.is_dictionary(column.type) else column.nbytes)
        if expanded > MAX_DATA_BYTES:
            raise BenchmarkError(f"{label}: its values expand to more than the {MAX_DATA_BYTES} (64 MiB) bytes a "
                                 f"benchmark data file may hold (a few values repeated over many rows)")
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=batches[0].schema).to_pylist() if batches else []


def _read_file(where: str, path: Path, label: str, most: int) -> list[tuple[str, Any]]:
    """The file's records, each with where it is in the file ("line 7" of JSON lines or CSV,
    "row 3" of Parquet, "record 2" of a JSON array), so that an error can point at it; at
    most `most` of them, counted before they are parsed."""
    name = path.name.lower().removesuffix(".gz")
    try:
        if name.endswith(".parquet"):
            rows = _read_parquet(path, label, most)
        else:
            text = _read_bytes(path, label).decode("utf-8")
    except BenchmarkError as e:
        raise BenchmarkError(f"{where}: {e}") from None
    except (OSError, ValueError, ImportError, EOFError, zlib.error) as e:
        # EOFError / zlib.error: a truncated or corrupt .gz; ValueError covers bad UTF-8
        # and Parquet that pyarrow cannot read.
        raise BenchmarkError(f"{where}: cannot read {label} (corrupt or truncated?): {type(e).__name__}: {e}") from e
    if name.endswith(".parquet"):
        return [(f"row {index}", row) for index, row in enumerate(rows)]
    if name.endswith(".csv"):
        return _csv_records(where, label, text, most)
    if name.endswith(".json"):
        data = _json_document(where, label, text)
        if data is not None:
            if len(data) > most:
                raise BenchmarkError(f"{where}: {_too_many(label, f'{len(data):,}', most)}")
            return [(f"record {index}", record) for index, record in enumerate(data)]
    lines = sum(1 for line in text.split("\n") if line.strip())
    if lines > most:
        raise BenchmarkError(f"{where}: {_too_many(label, f'{lines:,}', most)}")
    records = []
    # Split at "\n" only: `splitlines` also splits at U+2028 and other breaks that JSON
    # strings may hold as they are, which would cut a record in two.
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                records.append((f"line {lineno}", loads_json(line, f"{label} line {lineno}")))
            except InputError as e:
                raise BenchmarkError(f"{where}: {e}") from None
    return records


def _json_document(where: str, label: str, text: str) -> list | None:
    """The records of a .json file holding one JSON document (a list, or a mapping with its
    list under data/rows/records), or None for JSON lines (what `datasets` writes to .json)."""
    try:
        data = loads_json(text, label)
    except InputError as e:
        if text.lstrip().startswith("["):
            raise BenchmarkError(f"{where}: {e}") from None
        return None  # JSON lines, or bad JSON that the line reader names by its line
    if isinstance(data, dict):
        found = next((v for k, v in data.items() if k in ("data", "rows", "records")), None)
        if isinstance(found, list):
            return found
        if "\n" not in text.strip():
            return None  # one record on one line
    if not isinstance(data, list):
        raise BenchmarkError(f"{where}: {label} holds no list of records")
    return data


def _csv_records(where: str, label: str, text: str, most: int) -> list[tuple[str, dict]]:
    """The rows of a CSV file as records keyed by its header (line 1), each with the line it
    starts on; an empty cell is a missing value, a blank line no record."""
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    limit = csv.field_size_limit(MAX_DATA_BYTES)  # the default, 128 KiB, is less than a long prompt
    try:
        header = next(reader, None)
        if not header:
            raise BenchmarkError(f"{where}: {label} line 1: no header row naming the columns")
        for column in header:
            if not column.strip() or header.count(column) > 1:
                raise BenchmarkError(f"{where}: {label} line 1: column names must be non-empty and distinct, "
                                     f"got {len(header)} columns, column {header.index(column) + 1} "
                                     f"{excerpt(column)}")
        records, start = [], reader.line_num + 1
        for row in reader:
            if row:
                if len(row) != len(header):
                    raise BenchmarkError(f"{where}: {label} line {start}: {len(row)} fields, the header has "
                                         f"{len(header)}")
                records.append((f"line {start}", {key: value for key, value in zip(header, row) if value != ""}))
                if len(records) > most:
                    raise BenchmarkError(f"{where}: {_too_many(label, f'over {most:,}', most)}")
            start = reader.line_num + 1
        return records
    except csv.Error as e:
        raise BenchmarkError(f"{where}: {label} line {reader.line_num}: bad CSV: {e}") from e
    finally:
        csv.field_size_limit(limit)


def _mappings(where: str, label: str, records: list[tuple[str, Any]], located: bool = False) -> list[dict]:
    """The records, if each one is a JSON object (a bare string or number is no record) whose
    strings UTF-8 can encode (JSON's "\ud800" is a lone surrogate no tokenizer takes).
    `located`: errors name the record by its place in the file ("line 7") instead of its index."""
    for index, (location, record) in enumerate(records):
        named = f"{label} {location}" if located else f"record {index} of {label}"
        if not isinstance(record, dict):
            raise BenchmarkError(f"{where}: {named} is not an object: {excerpt(record)}")
        for problem in literal_problems(record):
            raise BenchmarkError(f"{where}: {named}: {problem}")
    return [record for _, record in records]


def _load_hub(where: str, source: Source) -> list[dict]:
    try:
        import datasets

        args = (source.hub,) if source.config is None else (source.hub, source.config)
        return list(datasets.load_dataset(*args, split=source.split, revision=source.revision))
    except Exception as e:
        offline = " (HF_HUB_OFFLINE is set, so only the local cache was tried)" if os.environ.get(
            "HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on") else ""
        raise BenchmarkError(
            f"{where}: cannot load from the Hugging Face hub {source.label()}{offline}: {type(e).__name__}: {e}"
        ) from e


def _located(where: str, source: Source, most: int) -> tuple[str, list[tuple[str, Any]]]:
    if source.path is not None:
        check_local(where, source)
        return str(source.path), _read_file(where, source.path, str(source.path), most)
    if source.package is not None:
        check_local(where, source)
        return source.label(), _read_file(where, source.package_file(), source.label(), most)
    rows = _load_hub(where, source)
    if len(rows) > most:
        raise BenchmarkError(f"{where}: {_too_many(source.label(), f'{len(rows):,}', most)}")
    return source.label(), [(f"row {index}", record) for index, record in enumerate(rows)]


def load_records(where: str, source: Source, most: int = MAX_RECORDS) -> list[dict]:
    """All records of the source, in order, at most `most`; any failure is one BenchmarkError
    naming `where` and the source tried."""
    label, records = _located(where, source, most)
    return _mappings(where, label, records)


def located_records(where: str, source: Source, most: int = MAX_RECORDS) -> list[tuple[str, dict]]:
    """`load_records`, each record with its place in the source: "line 7" (JSON lines, CSV
    with its header as line 1), "row 3" (Parquet, the hub) or "record 2" (a JSON array)."""
    label, records = _located(where, source, most)
    return list(zip([location for location, _ in records], _mappings(where, label, records, located=True)))
