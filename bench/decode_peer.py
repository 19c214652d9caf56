#!/usr/bin/env python3
"""The PyTorch peer of `gemmbridge bench --ops decode_attn`: decode attention (one query row
per sequence) on the shapes of bench/decode.json, timed through
torch.nn.functional.scaled_dot_product_attention on a contiguous KV cache with each of
PyTorch's fused backends, in the same JSON lines as gemmbridge (op "decode_attn", m = 1,
n = s_kv, k = d, batch = b, tflops 0, tbps = the bytes a call must move / median time, counted
as gemmbridge counts them: the keys and values each sequence holds, q read, o written).

One row per (dtype, shape, backend): cuDNN's under the shape's name (the row gemmbridge's
paged decode on cuDNN is set beside), flash attention's and the memory-efficient kernel's
under the name followed by "+flash" and "+efficient" (`gemmbridge compare` sets them beside
the same row of ours). q is [b, h_q, 1, d], k and v [b, h_kv, s_kv, d], contiguous; grouped
key/value heads through enable_gqa=True, or, where a backend refuses that, k and v expanded
to h_q heads once before timing (the row then says "gqa": "expanded"). A shape with
per-sequence lengths runs padded to s_kv (every sequence at the longest length: the dense
API takes no lengths without an explicit mask, which the fused backends refuse), its bytes
still counted from the lengths. A backend that refuses a shape gives a row with an "error".

Timing as bench/peer.py: 5 warm-up calls, then --reps samples of ~1 ms of back-to-back calls
between CUDA events, median and minimum per call; --gap-ms MS leaves the GPU idle for MS ms
before each row's warm-up.

Usage: python3 bench/decode_peer.py [--dtypes bf16,f16] [--backends cudnn,flash,efficient]
                                    [--shapes NAME,...] [--reps 30] [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode.json")) as fh:
    SHAPES = json.load(fh)["shapes"]
OP = "decode_attn"
DTYPES = ["bf16", "f16"]
BACKENDS = ["cudnn", "flash", "efficient"]
ELEM = {"bf16": 2, "f16": 2}


def lens(s):
    """The keys each sequence holds."""
    return s.get("lens") or [s["s_kv"]] * s["b"]


def bytes_moved(s, elem):
    """The bytes one call must move, as gemmbridge's bench/decode.rs counts them."""
    kv = 2.0 * sum(lens(s)) * s["h_kv"] * s["d"]
    return (kv + 2.0 * s["b"] * s["h_q"] * s["d"]) * elem


def layout(s, backend):
    return s["name"] if backend == "cudnn" else f"{s['name']}+{backend}"


def decode_fn(torch, q, k, v, backend, expanded):
    """The call a row times: SDPA on one backend, grouped heads native or expanded."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    kinds = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
    extra = {}
    if q.shape[1] != k.shape[1]:
        if expanded:
            group = q.shape[1] // k.shape[1]
            k, v = (t.repeat_interleave(group, dim=1).contiguous() for t in (k, v))
        else:
            extra["enable_gqa"] = True

    def call():
        with sdpa_kernel([kinds[backend]]), torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, **extra)
    return call


def timed(torch, make, reps):
    """(median, min, None) of the callable `make()` returns, or (None, None, why)."""
    try:
        fn = make()
        clock = peer.Clock("cuda")
        med, low = peer.time_fn(fn, clock, reps)
        return med, low, None
    except Exception as e:  # a backend that does not take the shape
        torch.cuda.synchronize()
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def record(s, dtype, backend, timed_, gqa):
    """A JSON row: the times and TB/s, or the error that stopped the row."""
    base = dict(op=OP, dtype=dtype, m=1, n=s["s_kv"], k=s["d"], batch=s["b"], layout=layout(s, backend))
    if s["h_q"] != s["h_kv"]:
        base["gqa"] = gqa
    med, low, err = timed_
    if err is not None:
        return dict(base, error=err)
    tbps = bytes_moved(s, ELEM[dtype]) / (med * 1e-3) / 1e12
    return dict(base, median_ms=med, min_ms=low, tflops=0.0, tbps=tbps)


def backend_row(torch, s, dtype, tensors, backend, reps):
    """The row of one backend: grouped heads native first, expanded where that fails."""
    q, k, v = tensors
    t = timed(torch, lambda: decode_fn(torch, q, k, v, backend, False), reps)
    gqa = "enable_gqa"
    if t[2] is not None and s["h_q"] != s["h_kv"]:
        expanded = timed(torch, lambda: decode_fn(torch, q, k, v, backend, True), reps)
        if expanded[2] is None:
            t, gqa = expanded, "expanded"
    return record(s, dtype, backend, t, gqa)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--shapes", default="", help="comma list of shape names (default: every shape)")
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        dtypes = peer.split_list("--dtypes", a.dtypes, DTYPES)
        backends = peer.split_list("--backends", a.backends, BACKENDS)
        names = sorted({s["name"] for s in SHAPES})
        wanted = peer.split_list("--shapes", a.shapes, names) if a.shapes.strip() else names
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    out = open(a.out, "w") if a.out else sys.stdout
    env = peer.cudnn_env(a.reps)
    print(json.dumps(env), file=out, flush=True)
    failed = False
    for dtype in dtypes:
        dt = peer.torch_dtype(dtype)
        for s in (s for s in SHAPES if s["name"] in wanted):
            b, hq, hk, sk, d = s["b"], s["h_q"], s["h_kv"], s["s_kv"], s["d"]
            q = torch.randn(b, hq, 1, d, device="cuda", dtype=dt)
            k = torch.randn(b, hk, sk, d, device="cuda", dtype=dt)
            v = torch.randn(b, hk, sk, d, device="cuda", dtype=dt)
            for backend in backends:
                rec = backend_row(torch, s, dtype, (q, k, v), backend, a.reps)
                failed |= "error" in rec and backend == "cudnn"
                print(json.dumps(rec), file=out, flush=True)
                print(f"{OP} {dtype:<5} b{b:<3} {rec['layout']:<36} {rec.get('median_ms', float('nan')):.4f} ms "
                      f"{rec.get('tbps', float('nan')):.2f} TB/s {rec.get('gqa', '')} {rec.get('error', '')}",
                      file=sys.stderr, flush=True)
            del q, k, v
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
