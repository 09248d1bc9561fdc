"""Cell Parquet files: bytes per generated token and write/read time by compression codec.

storage.write_table writes zstd (level 3). This compares it with snappy (Parquet's usual
default), no compression, a few others for context, and zstd with byte-stream-split
encoding, on two cell tables with k = 16:
  real       SmolLM2 (fp32, greedy, real EOS) decoded by tokenflip's loop on chat-templated
             questions: what a cell file really holds (small: a few hundred tokens)
  synthetic  100 prompts x 256 steps with realistic values (pipeline_scale.py's generator):
             the size of a paper-scale cell, used for the timings
Write = pq.write_table to a local file (no fsync), read = pq.read_table of every column;
codecs alternate round by round, medians over rounds, on this process's CPU time.

  .venv/bin/python perf/storage.py [--quick]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import _common as c
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pipeline_scale import base_arrays, cell_records

CODECS = {  # name -> pq.write_table keyword arguments
    "none": dict(compression="none"),
    "snappy": dict(compression="snappy"),
    "lz4": dict(compression="lz4"),
    "gzip": dict(compression="gzip"),
    "zstd-1": dict(compression="zstd", compression_level=1),
    "zstd-3": dict(compression="zstd", compression_level=3),  # storage.write_table's choice
    "zstd-9": dict(compression="zstd", compression_level=9),
    # The same codec with Parquet's BYTE_STREAM_SPLIT encoding of the float columns (bytes
    # of each value regrouped by significance, so exponents and high bytes compress) and no
    # dictionary for them: not what storage.write_table does, measured as a possible change.
    "zstd-3-bss": dict(compression="zstd", compression_level=3),  # + use_byte_stream_split, set in main
}
BSS_TYPES = ("FLOAT", "DOUBLE")  # on the integer columns it did not help (top_ids grew slightly)


def float_leaves(table: pa.Table, tmp: Path) -> tuple[list[str], list[str]]:
    """Parquet column paths of the float leaves (list columns included), and of the others."""
    path = tmp / "schema.parquet"
    pq.write_table(table.slice(0, 1), path)
    schema = pq.ParquetFile(path).metadata.schema
    cols = [schema.column(i) for i in range(len(schema))]
    path.unlink()
    return ([col.path for col in cols if col.physical_type in BSS_TYPES],
            [col.path for col in cols if col.physical_type not in BSS_TYPES])
K = 16


def real_table(args, n_prompts: int, new_tokens: int) -> pa.Table:
    import torch

    from tokenflip.core import storage
    from tokenflip.run.decode import decode
    from tokenflip.run.runtime import eos_ids

    model, tokenizer = c.load_model(args, "fp32")
    pad = c.pad_id(model, tokenizer)
    ids, mask = c.batch(tokenizer, model, n_prompts, args.seed)
    with torch.inference_mode():
        res = decode(model, ids, mask, max_new_tokens=new_tokens, use_cache=True,
                     eos_token_ids=eos_ids(model, tokenizer), pad_token_id=pad, record_top_k=K)
    records = []
    for i, gen in enumerate(res.generations):
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        records.append({
            "prompt_index": i, "prompt_id": f"q-{i:04d}", "batch_index": 0,
            "prompt_ids": ids[i][mask[i].bool()].tolist(), "token_ids": gen.token_ids,
            "top_ids": np.asarray(gen.top_ids, dtype=np.int32).reshape(-1, K),
            "top_logits": np.asarray(gen.top_logits, dtype=np.float32).reshape(-1, K),
            "margin": gen.margin, "logsumexp": gen.logsumexp, "entropy": gen.entropy,
            "intervened": gen.intervened, "n_tokens": len(gen.token_ids), "finish_reason": gen.finish_reason,
            "text": text, "gold": None, "extracted": None, "correct": None, "answer_rule": "none",
            "verdict": "no_answer", "latency_s": res.wall_seconds,
        })
    return storage.cell_table(records, K)


def column_bytes(path: Path) -> dict[str, int]:
    meta = pq.ParquetFile(path).metadata
    out: dict[str, int] = {}
    for rg in range(meta.num_row_groups):
        for col in range(meta.num_columns):
            chunk = meta.row_group(rg).column(col)
            name = chunk.path_in_schema.split(".")[0]
            out[name] = out.get(name, 0) + chunk.total_compressed_size
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    c.model_args(p, precision=False)
    p.add_argument("--quick", action="store_true", help="a smaller real table and fewer rounds")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 7, 3 with --quick)")
    args = p.parse_args(argv)
    c.setup(args)
    rounds = args.rounds or (3 if args.quick else 7)
    c.header("cell Parquet: bytes per token and codec speed", args)
    t_start = time.perf_counter()
    real = real_table(args, 4 if args.quick else 8, 48 if args.quick else 96)
    rng = np.random.default_rng(0)
    from tokenflip.core import storage

    synthetic = storage.cell_table(cell_records(base_arrays(rng), rng), K)
    tables = {"real": real, "synthetic": synthetic}
    tmp = Path(tempfile.mkdtemp(prefix="tokenflip-storage-"))
    floats, others = float_leaves(real, tmp)
    CODECS["zstd-3-bss"].update(use_byte_stream_split=floats, use_dictionary=others)
    sizes: dict[str, dict[str, int]] = {}
    columns: dict[str, dict[str, int]] = {}
    for tname, table in tables.items():
        tokens = int(np.sum(table.column("n_tokens").to_numpy()))
        sizes[tname] = {"tokens": tokens}
        for codec, kw in CODECS.items():
            path = tmp / f"{tname}-{codec}.parquet"
            pq.write_table(table, path, **kw)
            sizes[tname][codec] = path.stat().st_size
            if tname == "synthetic" or codec in ("zstd-3", "snappy", "none", "zstd-3-bss"):
                columns[f"{tname}-{codec}"] = column_bytes(path)
            assert pq.read_table(path).equals(table)

    def writer(codec):
        return lambda: pq.write_table(synthetic, tmp / f"w-{codec}.parquet", **CODECS[codec])

    def reader(codec):
        return lambda: pq.read_table(tmp / f"synthetic-{codec}.parquet")

    writes = c.interleave({codec: writer(codec) for codec in CODECS}, rounds, seed=1)
    reads = c.interleave({codec: reader(codec) for codec in CODECS}, rounds, seed=2)

    print(f"\nreal: {real.num_rows} prompts, {sizes['real']['tokens']} generated tokens; synthetic: "
          f"{synthetic.num_rows} prompts, {sizes['synthetic']['tokens']} tokens "
          f"({synthetic.nbytes / 2**20:.1f} MiB in Arrow)")
    print(f"\n{'codec':8} {'real B/tok':>10} {'synth B/tok':>11} {'vs zstd-3':>9} {'write ms':>9} {'vs zstd-3':>9} "
          f"{'read ms':>8} {'vs zstd-3':>9}")
    ref = sizes["synthetic"]["zstd-3"]
    for codec in CODECS:
        w = c.median(writes.primary[codec])
        r = c.median(reads.primary[codec])
        print(f"{codec:8} {sizes['real'][codec] / sizes['real']['tokens']:>10.1f} "
              f"{sizes['synthetic'][codec] / sizes['synthetic']['tokens']:>11.1f} "
              f"{sizes['synthetic'][codec] / ref:>8.2f}x {1e3 * w:>9.1f} {writes.ratio(codec, 'zstd-3')[0]:>8.2f}x "
              f"{1e3 * r:>8.1f} {reads.ratio(codec, 'zstd-3')[0]:>8.2f}x")
    print("\nbytes per generated token by column (real data; zstd-3 / snappy / none / zstd-3-bss):")
    for col in ("top_logits", "top_ids", "token_ids", "margin", "logsumexp", "entropy", "text"):
        vals = [columns[f"real-{codec}"].get(col, 0) / sizes["real"]["tokens"]
                for codec in ("zstd-3", "snappy", "none", "zstd-3-bss")]
        print(f"  {col:11s} " + " / ".join(f"{v:6.1f}" for v in vals))
    real_ratio = sizes["real"]["snappy"] / sizes["real"]["zstd-3"]
    syn_ratio = sizes["synthetic"]["snappy"] / sizes["synthetic"]["zstd-3"]
    none_ratio = sizes["real"]["none"] / sizes["real"]["zstd-3"]
    wr = writes.ratio("zstd-3", "snappy")[0]
    rr = reads.ratio("zstd-3", "snappy")[0]
    print(f"\nsummary: zstd-3 {sizes['real']['zstd-3'] / sizes['real']['tokens']:.0f} B/token on real data "
          f"({sizes['synthetic']['zstd-3'] / sizes['synthetic']['tokens']:.0f} synthetic); snappy files are "
          f"{real_ratio:.2f}x larger (synthetic {syn_ratio:.2f}x), uncompressed {none_ratio:.2f}x; zstd-3 writes at "
          f"{wr:.2f}x and reads at {rr:.2f}x snappy's time; with byte-stream-split zstd-3 would be "
          f"{sizes['real']['zstd-3-bss'] / sizes['real']['tokens']:.0f} B/token "
          f"({sizes['real']['zstd-3'] / sizes['real']['zstd-3-bss']:.2f}x smaller)")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"runtime {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
