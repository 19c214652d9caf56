#!/usr/bin/env python3
"""The PyTorch peer of `gemmbridge bench --ops attn_fwd,attn_fwd_bwd`: the shapes of
bench/attention.json timed through torch.nn.functional.scaled_dot_product_attention with each
of PyTorch's fused backends (cuDNN, flash, memory-efficient) and, for the shapes with
per-sequence lengths, torch.nn.attention.varlen.varlen_attn where PyTorch has it, in the same
JSON lines as gemmbridge (m = s_q, n = s_kv, k = d, batch = b, layout = the shape's name;
TFLOP/s as gemmbridge counts them). One row per (dtype, shape, op): the fastest backend's,
naming it in "backend", with every backend's time (or why it could not run) in "backends".

Tensors are [b, s, h, d] in memory viewed as [b, h, s, d] (BSHD, as gemmbridge's rows).
Masks: "causal" is is_causal=True; "bottom_right" is torch.nn.attention.bias.causal_lower_right.
Shapes with lengths run padded: an explicit boolean mask of the lengths (and the causal
mask) over the padded extent, the padded equivalent of gemmbridge's per-sequence lengths; and,
as a second row whose layout ends in "+varlen_attn", varlen_attn on the packed sequences
(flash attention's variable-length path; no backward row where it has none).

attn_fwd times the forward; attn_fwd_bwd the forward and the backward (torch.autograd.grad of
the output against a fixed gradient, for q, k and v); decoding shapes (one query row) get no
attn_fwd_bwd row. Timing as bench/peer.py: 5 warm-up calls,
then --reps samples of ~1 ms of back-to-back calls between CUDA events, median and minimum per
call; --gap-ms MS leaves the GPU idle for MS ms before each row's warm-up.

Usage: python3 bench/attn_peer.py [--dtypes bf16,f16] [--ops attn_fwd,attn_fwd_bwd]
                                  [--shapes NAME,...] [--reps 30] [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import inspect
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "attention.json")) as fh:
    SHAPES = json.load(fh)["shapes"]
OPS = ["attn_fwd", "attn_fwd_bwd"]
DTYPES = ["bf16", "f16"]
BACKENDS = ["cudnn", "flash", "efficient"]


def flops(s, op):
    if s.get("lens_q"):
        per = sum(a * b for a, b in zip(s["lens_q"], s["lens_kv"]))
    else:
        per = s["b"] * s["s_q"] * s["s_kv"]
    f = 4.0 * s["h_q"] * s["d"] * per
    if s["mask"] != "none":
        f /= 2
    return f * (1.0 if op == "attn_fwd" else 3.5)


def tensors(torch, s, dt):
    b, hq, hk, sq, sk, d = s["b"], s["h_q"], s["h_kv"], s["s_q"], s["s_kv"], s["d"]
    q = torch.randn(b, sq, hq, d, device="cuda", dtype=dt).transpose(1, 2)
    k = torch.randn(b, sk, hk, d, device="cuda", dtype=dt).transpose(1, 2)
    v = torch.randn(b, sk, hk, d, device="cuda", dtype=dt).transpose(1, 2)
    do = torch.randn(b, sq, hq, d, device="cuda", dtype=dt).transpose(1, 2)
    return q, k, v, do


def mask_args(torch, s):
    """sdpa's keyword arguments for the shape's mask (and lengths, padded)."""
    sq, sk = s["s_q"], s["s_kv"]
    if s.get("lens_q"):
        lq = torch.tensor(s["lens_q"], device="cuda").view(-1, 1, 1, 1)
        lk = torch.tensor(s["lens_kv"], device="cuda").view(-1, 1, 1, 1)
        i = torch.arange(sq, device="cuda").view(1, 1, -1, 1)
        j = torch.arange(sk, device="cuda").view(1, 1, 1, -1)
        keep = (i < lq) & (j < lk)
        if s["mask"] == "causal":
            keep = keep & (j <= i)
        elif s["mask"] == "bottom_right":
            keep = keep & (j <= i + lk - lq)
        return dict(attn_mask=keep)
    if s["mask"] == "causal":
        return dict(is_causal=True)
    if s["mask"] == "bottom_right":
        from torch.nn.attention.bias import causal_lower_right
        return dict(attn_mask=causal_lower_right(sq, sk))
    return {}


def sdpa_fn(torch, s, q, k, v, do, op, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    kinds = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}
    extra = mask_args(torch, s)
    if s["h_q"] != s["h_kv"]:
        extra["enable_gqa"] = True
    if op == "attn_fwd_bwd":
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))

    def call():
        with sdpa_kernel([kinds[backend]]):
            if op == "attn_fwd":
                with torch.no_grad():
                    return F.scaled_dot_product_attention(q, k, v, **extra)
            o = F.scaled_dot_product_attention(q, k, v, **extra)
            return torch.autograd.grad(o, (q, k, v), do)
    return call


def varlen_fn(torch, s, dt, op):
    """varlen_attn on the packed sequences, or None where PyTorch has no such path."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    lq, lk = s["lens_q"], s["lens_kv"]
    tq, tk = sum(lq), sum(lk)
    cu = lambda lens: torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], device="cuda",
                                    dtype=torch.int32)
    q = torch.randn(tq, s["h_q"], s["d"], device="cuda", dtype=dt)
    k = torch.randn(tk, s["h_kv"], s["d"], device="cuda", dtype=dt)
    v = torch.randn(tk, s["h_kv"], s["d"], device="cuda", dtype=dt)
    do = torch.randn(tq, s["h_q"], s["d"], device="cuda", dtype=dt)
    params = inspect.signature(varlen_attn).parameters
    kw = {}
    # a single query row per sequence sees every key under either causal alignment
    causal = s["mask"] == "causal" or (s["mask"] == "bottom_right" and max(lq) > 1)
    if causal:
        if "is_causal" in params:
            kw["is_causal"] = True
        else:
            kw["window_size"] = (-1, 0)
    if s["h_q"] != s["h_kv"]:
        if "enable_gqa" not in params:
            raise RuntimeError("varlen_attn here takes no grouped key/value heads (no enable_gqa)")
        kw["enable_gqa"] = True
    if op == "attn_fwd_bwd":
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    args = (q, k, v, cu(lq), cu(lk), max(lq), max(lk))

    def call():
        if op == "attn_fwd":
            with torch.no_grad():
                return varlen_attn(*args, **kw)
        o = varlen_attn(*args, **kw)
        return torch.autograd.grad(o, (q, k, v), do)
    return call


def timed(torch, make, reps):
    """(median, min, None) of the callable `make()` returns, or (None, None, why)."""
    try:
        fn = make()
        if fn is None:
            return None, None, "not in this PyTorch"
        clock = peer.Clock("cuda")
        med, low = peer.time_fn(fn, clock, reps)
        return med, low, None
    except Exception as e:  # a backend that does not take the shape
        torch.cuda.synchronize()
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def record(s, op, dtype, layout, times):
    ok = {b: t for b, t in times.items() if t[0] is not None}
    base = dict(op=op, dtype=dtype, m=s["s_q"], n=s["s_kv"], k=s["d"], batch=s["b"], layout=layout,
                backends={b: (t[0] if t[0] is not None else t[2]) for b, t in times.items()})
    if not ok:
        return dict(base, error="no backend ran this shape")
    best = min(ok, key=lambda b: ok[b][0])
    med, low, _ = ok[best]
    return dict(base, backend=best, median_ms=med, min_ms=low, tflops=flops(s, op) / (med * 1e-3) / 1e12)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--shapes", default="", help="comma list of shape names (default: every shape)")
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        dtypes = peer.split_list("--dtypes", a.dtypes, DTYPES)
        ops = peer.split_list("--ops", a.ops, OPS)
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
            q, k, v, do = tensors(torch, s, dt)
            for op in ops:
                if op == "attn_fwd_bwd" and s["s_q"] == 1:
                    continue  # decoding runs no backward (as gemmbridge's rows)
                times = {b: timed(torch, lambda b=b: sdpa_fn(torch, s, q, k, v, do, op, b), a.reps) for b in BACKENDS}
                rows = [record(s, op, dtype, s["name"], times)]
                if s.get("lens_q"):
                    vt = {"varlen_attn": timed(torch, lambda: varlen_fn(torch, s, dt, op), a.reps)}
                    rows.append(record(s, op, dtype, s["name"] + "+varlen_attn", vt))
                for rec in rows:
                    failed |= "error" in rec
                    print(json.dumps(rec), file=out, flush=True)
                    print(f"{op:<13} {dtype:<5} {rec['layout']:<28} {rec.get('backend', '-'):<11} "
                          f"{rec.get('median_ms', float('nan')):.4f} ms {rec.get('tflops', float('nan')):.1f} TF/s "
                          f"{rec['backends']}", file=sys.stderr, flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
