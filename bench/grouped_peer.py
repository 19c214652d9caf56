#!/usr/bin/env python3
"""The PyTorch peer of gemmbridge's grouped-GEMM rows (torch._grouped_mm, torch._scaled_grouped_mm).

The peer of `gemmbridge bench --ops grouped,grouped_dx,grouped_dw,grouped_fp8,grouped_fp8_dx`: the
mixture-of-experts shapes of bench/grouped.json through torch._grouped_mm (PyTorch's own grouped
kernels, the rows sorted by expert and the group ends as int32 offsets on the device): the
forward y = x · w[e]ᵀ (grouped), the backward data dx = dy · w[e] (grouped_dx) and the backward
weight dw[e] = dy[e]ᵀ · x[e] (grouped_dw, the 2-D × 2-D form with a 3-D result), in the same
JSON lines as gemmbridge (m = Σ rows, n, k, batch = experts, layout = the shape's name;
TFLOP/s = 2·Σ m_e·N·K / time). grouped_fp8 times torch._scaled_grouped_mm, the forward on
E4M3 operands with row-wise scales (x per row, w per expert and output feature: PyTorch's
grouped FP8 recipe on Hopper), bf16 output, quantised before the timing starts (dtype
fp8_e4m3, layout "<name>/rowwise"); grouped_fp8_dx the backward data the same way (dy per row,
w[e]ᵀ per expert and input feature). The FP8 backward weight has no row here. A second row per
shape of the bf16/f16 ops, layout "<name>+loop", times a Python loop of one torch.matmul per
expert, for context. Timing as bench/peer.py: 5 warm-up calls,
then --reps samples of ~1 ms of back-to-back calls between CUDA events, median and minimum per
call; --gap-ms MS leaves the GPU idle for MS ms before each row's warm-up.

Usage: python3 bench/grouped_peer.py [--ops grouped,grouped_dx,grouped_dw,grouped_fp8,grouped_fp8_dx]
                                     [--dtypes bf16,f16]
                                     [--shapes NAME,...] [--reps 30]
                                     [--gap-ms MS] [--out FILE]
Usage errors and a missing PyTorch or GPU exit with status 2.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (Clock, time_fn: the dense peer's timing)

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "grouped.json")) as fh:
    SHAPES = json.load(fh)["shapes"]
DTYPES = ["bf16", "f16"]
FP8_OPS = ["grouped_fp8", "grouped_fp8_dx"]
OPS = ["grouped", "grouped_dx", "grouped_dw"] + FP8_OPS


def timed(torch, fn, reps):
    """(median, min, None), or (None, None, why) where PyTorch refuses the call."""
    try:
        fn()
        med, low = peer.time_fn(fn, peer.Clock("cuda"), reps)
        return med, low, None
    except Exception as e:  # a dtype or shape the kernel does not take
        torch.cuda.synchronize()
        return None, None, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def calls(torch, op, x, dy, w, offs, sizes):
    """(grouped call, loop of matmuls) of one product."""
    xs, dys = x.split(sizes), dy.split(sizes)
    if op == "grouped_dx":
        return (lambda: torch._grouped_mm(dy, w, offs=offs),
                lambda: [torch.matmul(d, w[i]) for i, d in enumerate(dys)])
    if op == "grouped_dw":
        return (lambda: torch._grouped_mm(dy.t(), x, offs=offs),
                lambda: [torch.matmul(d.t(), xi) for d, xi in zip(dys, xs)])
    return (lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
            lambda: [torch.matmul(xi, w[i].t()) for i, xi in enumerate(xs)])


def rows(torch, op, s, name, dt, reps):
    m, n, k, e = sum(s["sizes"]), s["n"], s["k"], s["e"]
    x = torch.randn(m, k, device="cuda", dtype=dt)
    dy = torch.randn(m, n, device="cuda", dtype=dt)
    w = torch.randn(e, n, k, device="cuda", dtype=dt)
    offs = torch.tensor(s["sizes"], device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    grouped, loop = calls(torch, op, x, dy, w, offs, s["sizes"])
    for layout, (backend, fn) in {s["name"]: ("_grouped_mm", grouped), s["name"] + "+loop": ("matmul loop", loop)}.items():
        med, low, why = timed(torch, fn, reps)
        base = dict(op=op, dtype=name, m=m, n=n, k=k, batch=e, layout=layout, backend=backend)
        if med is None:
            yield dict(base, error=why)
        else:
            yield dict(base, median_ms=med, min_ms=low, tflops=2.0 * m * n * k / (med * 1e-3) / 1e12)


def fp8_rows(torch, op, s, reps):
    """The row-wise FP8 forward (grouped_fp8) or backward data (grouped_fp8_dx) through
    torch._scaled_grouped_mm: a[M, inner] per row times b[e][inner, out] (column-major, scales
    per expert and output feature). The forward is x · w[e]ᵀ (inner K, out N); the backward data
    dy · w[e] is the same call with N and K swapped (inner N, out K: w[e]ᵀ stored [K, N])."""
    m, n, k, e = sum(s["sizes"]), s["n"], s["k"], s["e"]
    out_f, inner = (k, n) if op == "grouped_fp8_dx" else (n, k)
    f8 = torch.float8_e4m3fn
    a = torch.randn(m, inner, device="cuda", dtype=torch.bfloat16)
    sa = a.abs().amax(dim=1).float().clamp(min=1e-12) / 448.0
    aq = (a.float() / sa[:, None]).to(f8)
    del a
    b = torch.randn(e, out_f, inner, device="cuda", dtype=torch.bfloat16)
    sb = b.abs().amax(dim=2).float().clamp(min=1e-12) / 448.0
    bq = torch.empty(e, out_f, inner, device="cuda", dtype=f8)
    for i in range(e):  # one expert at a time: the f32 copy of every expert is large
        bq[i] = (b[i].float() / sb[i][:, None]).to(f8)
    del b
    offs = torch.tensor(s["sizes"], device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    fn = lambda: torch._scaled_grouped_mm(aq, bq.transpose(-2, -1), sa, sb, offs=offs,  # noqa: E731
                                          out_dtype=torch.bfloat16)
    med, low, why = timed(torch, fn, reps)
    base = dict(op=op, dtype="fp8_e4m3", m=m, n=n, k=k, batch=e, layout=s["name"] + "/rowwise",
                backend="_scaled_grouped_mm")
    if med is None:
        return [dict(base, error=why)]
    return [dict(base, median_ms=med, min_ms=low, tflops=2.0 * m * n * k / (med * 1e-3) / 1e12)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default="grouped", help="comma list of " + ", ".join(OPS) + " (default: grouped)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--shapes", default="", help="comma list of shape names (default: every shape)")
    peer.add_timing_args(ap)
    a = ap.parse_args()
    try:
        peer.use_timing_args(a)
        ops = peer.split_list("--ops", a.ops, OPS)
        dtypes = peer.split_list("--dtypes", a.dtypes, DTYPES)
        names = [s["name"] for s in SHAPES]
        wanted = peer.split_list("--shapes", a.shapes, names) if a.shapes.strip() else names
    except peer.UsageError as e:
        ap.error(str(e))
    rc = peer.import_torch("cuda")
    if rc:
        return rc
    torch = peer.torch
    dts = {"bf16": torch.bfloat16, "f16": torch.float16}
    out = open(a.out, "w") if a.out else None
    env = dict(op="env", backend="torch", torch=torch.__version__, cuda=torch.version.cuda,
               device=torch.cuda.get_device_name(), reps=a.reps, gap_ms=a.gap_ms)
    dense_ops = [op for op in ops if op not in FP8_OPS]
    fp8 = [r for op in ops if op in FP8_OPS for s in SHAPES if s["name"] in wanted for r in fp8_rows(torch, op, s, a.reps)]
    for line in [env] + [r for d in dtypes for s in SHAPES if s["name"] in wanted
                         for op in dense_ops for r in rows(torch, op, s, d, dts[d], a.reps)] + fp8:
        text = json.dumps(line)
        print(text, flush=True)
        if out:
            out.write(text + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    sys.exit(main())
