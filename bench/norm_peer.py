#!/usr/bin/env python3
"""The PyTorch peer of `gemmbridge bench --ops rmsnorm,rmsnorm_fwd_bwd`: RMSNorm of ROWS x 4096
(rows 2048, 8192, 16384, 32768; eps 1e-5; bf16 and f16) through
torch.nn.functional.rms_norm, in the same JSON lines as gemmbridge (m = rows, n = features,
k = batch = 1, layout "d4096", tflops 0, tbps = the bytes a call must move / median time,
counted as gemmbridge counts them).

rmsnorm times the forward under torch.no_grad(); rmsnorm_fwd_bwd the forward and the backward
(torch.autograd.grad of y against a fixed dy, for x and w: dx, and dw in the I/O type). Bytes:
x and w read, y written, and for rmsnorm_fwd_bwd also the inverse RMS (f32) written, then x,
dy, w and the inverse RMS read, dx and dw written.

A second row per (dtype, rows, op), layout "d4096+compile", times torch.compile(F.rms_norm)
(compiled once per shape during the warm-up); `gemmbridge compare` sets it beside the same row
of ours. Where torch.compile fails the row carries an "error"; --no-compile leaves it out.
Timing as bench/peer.py: 5 warm-up calls, then --reps samples of ~1 ms of back-to-back calls
between CUDA events, median and minimum per call; --gap-ms MS leaves the GPU idle for MS ms
before each row's warm-up.

Usage: python3 bench/norm_peer.py [--dtypes bf16,f16] [--ops rmsnorm,rmsnorm_fwd_bwd]
                                  [--rows 2048,8192,16384,32768] [--no-compile] [--reps 30]
                                  [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)

OPS = ["rmsnorm", "rmsnorm_fwd_bwd"]
DTYPES = ["bf16", "f16"]
ROWS = [2048, 8192, 16384, 32768]
FEATURES = 4096
EPS = 1e-5
ELEM = {"bf16": 2, "f16": 2}


def bytes_moved(rows, features, elem, op):
    """The bytes one call must move, as gemmbridge's RmsNorm::forward_bytes and backward_bytes
    count them (dw in the I/O type)."""
    r, c = float(rows), float(features)
    forward = 2 * r * c * elem + c * elem
    if op == "rmsnorm":
        return forward
    return forward + 4 * r + 3 * r * c * elem + c * elem + 4 * r + c * elem


def norm_fn(torch, op, x, w, dy, compiled):
    """The call a row times."""
    F = torch.nn.functional
    norm = (lambda x, w: F.rms_norm(x, (FEATURES,), w, EPS))
    if compiled:
        norm = torch.compile(norm, dynamic=False)
    if op == "rmsnorm":
        def call():
            with torch.no_grad():
                return norm(x, w)
        return call
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()

    def call():
        y = norm(xg, wg)
        return torch.autograd.grad(y, (xg, wg), dy)
    return call


def record(op, dtype, rows, layout, timed):
    """A JSON row: the times and TB/s, or the error that stopped the row."""
    base = dict(op=op, dtype=dtype, m=rows, n=FEATURES, k=1, batch=1, layout=layout)
    med, low, err = timed
    if err is not None:
        return dict(base, error=err)
    tbps = bytes_moved(rows, FEATURES, ELEM[dtype], op) / (med * 1e-3) / 1e12
    return dict(base, median_ms=med, min_ms=low, tflops=0.0, tbps=tbps)


def timed(torch, make, reps):
    """(median, min, None) of the callable `make()` returns, or (None, None, why)."""
    try:
        fn = make()
        clock = peer.Clock("cuda")
        med, low = peer.time_fn(fn, clock, reps)
        return med, low, None
    except Exception as e:  # torch.compile failing, say
        torch.cuda.synchronize()
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def parse_rows(text):
    try:
        rows = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise peer.UsageError(f"--rows {text!r}: a comma-separated list of row counts")
    if not rows or any(r < 1 for r in rows):
        raise peer.UsageError(f"--rows {text!r}: every row count is at least 1")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--rows", default=",".join(str(r) for r in ROWS))
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    peer.add_timing_args(ap)
    peer.add_round_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        dtypes = peer.split_list("--dtypes", a.dtypes, DTYPES)
        ops = peer.split_list("--ops", a.ops, OPS)
        rows_list = parse_rows(a.rows)
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    variants = [("d4096", False)] + ([] if a.no_compile else [("d4096+compile", True)])

    def one_run(out):
        env = peer.cudnn_env(a.reps)
        print(json.dumps(env), file=out, flush=True)
        failed = False
        for dtype in dtypes:
            dt = peer.torch_dtype(dtype)
            for rows in rows_list:
                x = torch.randn(rows, FEATURES, device="cuda", dtype=dt)
                w = torch.randn(FEATURES, device="cuda", dtype=dt)
                dy = torch.randn(rows, FEATURES, device="cuda", dtype=dt)
                for op in ops:
                    for layout, compiled in variants:
                        t = timed(torch, lambda: norm_fn(torch, op, x, w, dy, compiled), a.reps)
                        rec = record(op, dtype, rows, layout, t)
                        failed |= "error" in rec and not compiled
                        print(json.dumps(rec), file=out, flush=True)
                        print(f"{op:<16} {dtype:<5} {rows:>6}x{FEATURES} {layout:<14} "
                              f"{rec.get('median_ms', float('nan')):.4f} ms {rec.get('tbps', float('nan')):.2f} TB/s "
                              f"{rec.get('error', '')}", file=sys.stderr, flush=True)
                del x, w, dy
                torch.cuda.empty_cache()
        return 1 if failed else 0

    try:
        return peer.alternate(a, one_run)
    except peer.UsageError as e:
        ap.error(str(e))

if __name__ == "__main__":
    sys.exit(main())
