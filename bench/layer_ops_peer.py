#!/usr/bin/env python3
"""The PyTorch peer of gemmbridge's layer-op rows (RoPE, SwiGLU and its backward).

The peer of `gemmbridge bench --ops rope,swiglu,swiglu_bwd`, on the same LLaMA 3 8B shapes and
in the same JSON lines (op, dtype, m, n, k, batch, median_ms, min_ms, tflops 0, layout
"llama3_8b", bytes, tb_s; bytes as gemmbridge counts them, the least a kernel must read and
write, whatever PyTorch's kernels move):
- rope: q and k of the fused QKV projection's output [8192, (32 + 2·8)·128] rotated in place
  as Hugging Face's LLaMA does it (q·cos + rotate_half(q)·sin, cos and sin [8192, 128] made
  beforehand in the storage dtype, as its rotary embedding returns them), written back into
  the QKV buffer (m = tokens, n = 40 rotated heads, k = 128);
- swiglu: F.silu(g) · u over [g | u] = [8192, 2·14336] (m = 8192, n = 14336, k = 28672);
- swiglu_bwd: dg and du from dy, g, u (torch.ops.aten.silu_backward(dy·u, g) and dy·silu(g),
  copied into the halves of one [8192, 2·14336] buffer);
and a device-to-device copy row (op d2d_copy) of the SwiGLU input's bytes, read + write counted.
Timing as bench/peer.py: 5 warm-up calls, then --reps samples of ~1 ms of back-to-back calls
between CUDA events, median and minimum per call; --gap-ms MS leaves the GPU idle for MS ms
before each row's warm-up.

Usage: python3 bench/layer_ops_peer.py [--ops rope,swiglu,swiglu_bwd] [--dtypes bf16,f16,f32]
                                   [--reps 30] [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)

OPS = ["rope", "swiglu", "swiglu_bwd"]
DTYPES = ["bf16", "f16", "f32"]
TOKENS, HQ, HKV, D, FFN = 8192, 32, 8, 128, 14336


def row(op, name, dims, bytes_moved, fn, reps):
    med, low = peer.time_fn(fn, peer.Clock("cuda"), reps)
    m, n, k = dims
    return dict(op=op, dtype=name, m=m, n=n, k=k, batch=1, median_ms=med, min_ms=low, tflops=0.0,
                layout="llama3_8b", bytes=bytes_moved, tb_s=bytes_moved / (med * 1e-3) / 1e12)


def inv_freqs(torch):
    """LLaMA 3.1's frequencies (θ = 500 000, factor 8, low 1, high 4, 8192), in f32."""
    import math
    f = 1.0 / (500_000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    wavelen = 2 * math.pi / f
    low, high = 8192 / 1.0, 8192 / 4.0
    smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
    scaled = torch.where(wavelen > low, f / 8, f)
    mid = (wavelen <= low) & (wavelen >= high)
    return torch.where(mid, (1 - smooth) * scaled / 8 + smooth * scaled, scaled)


def rope_fn(torch, dt):
    qkv = torch.randn(TOKENS, (HQ + 2 * HKV) * D, device="cuda", dtype=dt)
    pos = torch.arange(2048, device="cuda", dtype=torch.float32).repeat(TOKENS // 2048)
    freqs = torch.outer(pos, inv_freqs(torch).cuda())
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dt)[:, None, :], emb.sin().to(dt)[:, None, :]
    qk = qkv[:, :(HQ + HKV) * D].view(TOKENS, HQ + HKV, D)

    def rotate_half(x):
        return torch.cat((-x[..., D // 2:], x[..., :D // 2]), dim=-1)

    return lambda: qk.copy_(qk * cos + rotate_half(qk) * sin)


def swiglu_fns(torch, dt):
    F = torch.nn.functional
    gu = torch.randn(TOKENS, 2 * FFN, device="cuda", dtype=dt)
    dy = torch.randn(TOKENS, FFN, device="cuda", dtype=dt)
    dgu = torch.empty_like(gu)
    g, u = gu[:, :FFN], gu[:, FFN:]

    def backward():
        dgu[:, :FFN].copy_(torch.ops.aten.silu_backward(dy * u, g))
        dgu[:, FFN:].copy_(dy * F.silu(g))

    return (lambda: F.silu(g) * u), backward


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        ops = peer.split_list("--ops", a.ops, OPS)
        dtypes = peer.split_list("--dtypes", a.dtypes, DTYPES)
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    dts = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    elem = {"bf16": 2, "f16": 2, "f32": 4}
    out = open(a.out, "w") if a.out else sys.stdout
    peer.emit(out, dict(op="env", backend="torch", torch=torch.__version__, cuda=torch.version.cuda,
                        device=torch.cuda.get_device_name(), reps=a.reps, gap_ms=a.gap_ms))
    src = torch.zeros(TOKENS * 2 * FFN, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    peer.emit(out, row("d2d_copy", "bf16", (src.numel(), 1, 1), 4.0 * src.numel(), lambda: dst.copy_(src), a.reps))
    del src, dst
    for name in dtypes:
        dt, e = dts[name], elem[name]
        for op in ops:
            if op == "rope":
                dims, bytes_moved, fn = (TOKENS, HQ + HKV, D), 2.0 * TOKENS * (HQ + HKV) * D * e, rope_fn(torch, dt)
            else:
                fn = swiglu_fns(torch, dt)[0 if op == "swiglu" else 1]
                factor = 3.0 if op == "swiglu" else 5.0
                dims, bytes_moved = (TOKENS, FFN, 2 * FFN), factor * TOKENS * FFN * e
            peer.emit(out, row(op, name, dims, bytes_moved, fn, a.reps))
            del fn
            torch.cuda.empty_cache()
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
