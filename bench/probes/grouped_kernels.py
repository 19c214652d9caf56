#!/usr/bin/env python3
"""Where a skewed grouped GEMM's time goes, kernel by kernel: PyTorch's grouped kernel
(torch._grouped_mm) against cuBLAS's grouped call (cublasGemmGroupedBatchedEx, called here
through ctypes on PyTorch's cuBLAS handle, as gemmbridge's GroupedBatched way calls it) and
against one cuBLAS GEMM per group (the kernels gemmbridge's stream pool spreads over streams).

For each shape of bench/grouped.json named by --shapes and each op (grouped: y = x·w[e]ᵀ,
grouped_dx: dx = dy·w[e], grouped_dw: dw[e] = dy[e]ᵀ·x[e]) the three ways run --reps times
under torch.profiler; one JSON line per (shape, op, way) gives every GPU kernel's name, calls
per product and mean µs, and the kernels' summed time per product (the GPU time a way costs
when nothing overlaps: the per-group way's wall time on several streams is below it).

Usage: python3 bench/probes/grouped_kernels.py [--shapes qwen3-zipf,...] [--ops grouped,...]
                                               [--reps 20] [--dtype bf16]
"""
import argparse
import ctypes
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "..", "grouped.json")) as fh:
    SHAPES = {s["name"]: s for s in json.load(fh)["shapes"]}

# cublas_api.h / library_types.h
OP_N, OP_T = 0, 1
CUDA_R_16F, CUDA_R_16BF = 2, 14
COMPUTE_32F = 68


def cublas():
    import torch  # noqa: F401  (its libcublas is the one loaded)
    lib = ctypes.CDLL("libcublas.so.13", mode=ctypes.RTLD_GLOBAL)
    f = lib.cublasGemmGroupedBatchedEx
    f.restype = ctypes.c_int
    return lib


def grouped_call(torch, lib, dt, gemms):
    """A closure calling cublasGemmGroupedBatchedEx, one group per GEMM.
    gemms: (transa, transb, m, n, k, a, lda, b, ldb, c, ldc) per group, column-major terms."""
    g = len(gemms)
    ints = lambda v: (ctypes.c_int * g)(*v)  # noqa: E731
    cols = list(zip(*gemms))
    ta, tb, m, n, k = (ints(c) for c in cols[:5])
    lda, ldb, ldc = ints(cols[6]), ints(cols[8]), ints(cols[10])
    ptrs = torch.tensor([[t.data_ptr() for t in cols[i]] for i in (5, 7, 9)], dtype=torch.int64, device="cuda")
    alpha = (ctypes.c_float * g)(*[1.0] * g)
    beta = (ctypes.c_float * g)(*[0.0] * g)
    sizes = ints([1] * g)
    ty = CUDA_R_16BF if dt == torch.bfloat16 else CUDA_R_16F
    handle = ctypes.c_void_p(torch.cuda.current_blas_handle())
    pa, pb, pc = (ctypes.c_void_p(ptrs[i].data_ptr()) for i in range(3))

    def run():
        _ = ptrs  # the device pointer arrays live as long as the closure
        s = lib.cublasGemmGroupedBatchedEx(handle, ta, tb, m, n, k, alpha, pa, ty, lda, pb, ty, ldb,
                                           beta, pc, ty, ldc, g, sizes, COMPUTE_32F)
        if s != 0:
            raise RuntimeError(f"cublasGemmGroupedBatchedEx status {s}")
    return run


def ways(torch, lib, op, s, dt):
    """{way: callable} for one op of one shape (row-major operands, column-major cuBLAS terms)."""
    sizes, n, k, e = s["sizes"], s["n"], s["k"], s["e"]
    m = sum(sizes)
    x = torch.randn(m, k, device="cuda", dtype=dt)
    dy = torch.randn(m, n, device="cuda", dtype=dt)
    w = torch.randn(e, n, k, device="cuda", dtype=dt)
    offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    xs, dys = x.split(sizes), dy.split(sizes)
    if op == "grouped":
        y = torch.empty(m, n, device="cuda", dtype=dt)
        ys = y.split(sizes)
        g = [(OP_T, OP_N, n, r, k, w[i], k, xs[i], k, ys[i], n) for i, r in enumerate(sizes) if r]
        return {"torch_grouped_mm": lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
                "cublas_grouped": grouped_call(torch, lib, dt, g),
                "per_group": lambda: [torch.mm(xi, w[i].t(), out=ys[i]) for i, xi in enumerate(xs) if xi.shape[0]]}
    if op == "grouped_dx":
        dx = torch.empty(m, k, device="cuda", dtype=dt)
        dxs = dx.split(sizes)
        g = [(OP_N, OP_N, k, r, n, w[i], k, dys[i], n, dxs[i], k) for i, r in enumerate(sizes) if r]
        return {"torch_grouped_mm": lambda: torch._grouped_mm(dy, w, offs=offs),
                "cublas_grouped": grouped_call(torch, lib, dt, g),
                "per_group": lambda: [torch.mm(d, w[i], out=dxs[i]) for i, d in enumerate(dys) if d.shape[0]]}
    dw = torch.empty(e, n, k, device="cuda", dtype=dt)
    g = [(OP_N, OP_T, k, n, r, xs[i], k, dys[i], n, dw[i], k) for i, r in enumerate(sizes) if r]
    return {"torch_grouped_mm": lambda: torch._grouped_mm(dy.t(), x, offs=offs),
            "cublas_grouped": grouped_call(torch, lib, dt, g),
            "per_group": lambda: [torch.mm(d.t(), xs[i], out=dw[i]) for i, d in enumerate(dys) if d.shape[0]]}


def profile(torch, fn, reps):
    from torch.profiler import ProfilerActivity, profile as prof
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kern = {}
    for ev in p.events():
        if ev.device_type.name != "CUDA":
            continue
        us = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        c, t = kern.get(ev.name, (0, 0.0))
        kern[ev.name] = (c + 1, t + us)
    rows = [dict(kernel=k[:160], calls=c / reps, us_per_call=t / c) for k, (c, t) in kern.items()]
    rows.sort(key=lambda r: -r["calls"] * r["us_per_call"])
    return rows, sum(r["calls"] * r["us_per_call"] for r in rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="qwen3-zipf,qwen3")
    ap.add_argument("--ops", default="grouped,grouped_dx,grouped_dw")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    a = ap.parse_args()
    import torch
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    lib = cublas()
    for name in a.shapes.split(","):
        for op in a.ops.split(","):
            for way, fn in ways(torch, lib, op, SHAPES[name], dt).items():
                try:
                    kern, total = profile(torch, fn, a.reps)
                    print(json.dumps(dict(shape=name, op=op, way=way, kernel_us_per_product=total, kernels=kern[:6])))
                except Exception as ex:  # a way the library refuses
                    torch.cuda.synchronize()
                    print(json.dumps(dict(shape=name, op=op, way=way, error=str(ex)[:200])))
                sys.stdout.flush()


if __name__ == "__main__":
    main()
