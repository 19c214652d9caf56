#!/usr/bin/env python3
"""Drops the tactic database's dense GEMM entries that lose in the benchmark's bursts.

`gemmbridge tune` times candidates at the sustained clock (after 300 ms of heat); the
benchmark times short bursts. Given alternated runs of `gemmbridge bench` with the database
(DB_RUNS) and without it (HEUR_RUNS, the heuristic's own plans), each row's ratio
heuristic time / database time is taken per pair and its median over the pairs; the entry a
row used is dropped when that median is below THRESHOLD (the entry is slower in a burst than
the plan the heuristic makes). Entries of rows not benchmarked are kept.

usage: prune-burst.py DB OUT THRESHOLD DB_RUNS HEUR_RUNS   (runs comma-separated, paired in order)
"""
import json
import statistics
import sys

EPI = {"matmul": "none", "linear": "none", "linear_bias": "bias", "linear_bias_gelu": "gelu_bias"}


def key(op, dtype, m, n, k):
    """The cuBLASLt GEMM signature of a row-major row (crates/gemmbridge/src/cuda/tactics.rs):
    the column-major call Cᵀ = op(B)ᵀ·op(A)ᵀ, M bucketed to the next power of two."""
    bucket = 1
    while bucket < m:
        bucket *= 2
    if op == "matmul":  # x[m,k]·w[k,n]: NN, lda = n, ldb = k
        ops, lda, ldb = "NN", n, k
    else:  # x[m,k]·w[n,k]ᵀ: TN, lda = ldb = k
        ops, lda, ldb = "TN", k, k
    return (f"{ops} m{n} n{bucket} k{k} lda{lda} ldb{ldb} ldc{n} b1 {dtype} {EPI[op]} aux0 "
            "al256/256/256/256 ws33554432")


def rows(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("op") in EPI and "median_ms" in r and r.get("batch", 1) == 1:
            out[(r["op"], r["dtype"], r["m"], r["n"], r["k"])] = r["median_ms"]
    return out


def main(db_path, out_path, threshold, db_runs, heur_runs):
    db = json.load(open(db_path))
    pairs = list(zip(map(rows, db_runs.split(",")), map(rows, heur_runs.split(","))))
    dropped = []
    for row in sorted(set.intersection(*(set(d) & set(h) for d, h in pairs))):
        sig = key(*row)
        if sig not in db["entries"]:
            continue
        ratios = [h[row] / d[row] for d, h in pairs]
        med = statistics.median(ratios)
        verdict = "drop" if med < float(threshold) else "keep"
        print(f"{verdict} {row[0]:<17}{row[1]:<5} {row[2]}x{row[3]}x{row[4]}  heuristic/db {med:.3f}  "
              f"({' '.join(f'{r:.3f}' for r in ratios)})")
        if verdict == "drop":
            dropped.append(sig)
    for sig in dropped:
        db["entries"].pop(sig, None)
    json.dump(db, open(out_path, "w"), indent=1)
    print(f"{len(dropped)} entries dropped, {len(db['entries'])} kept")


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    main(*sys.argv[1:])
