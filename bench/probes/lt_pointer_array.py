"""Whether the system cuBLASLt runs a pointer-array batched matmul (CUBLASLT_BATCH_MODE_POINTER_ARRAY,
every matrix of the batch at its own address) on this GPU, and how fast on a mixture-of-experts
forward cut into row chunks: each expert's rows in chunks of 128, 64, ..., 1 rows, every chunk
size one pointer-array matmul (at most eight launches for any routing), against
torch._grouped_mm on the same sizes. Through ctypes; prints one line per shape and dtype (the
chunked call's error against a loop of torch.matmul, and both times). Used to decide whether
gemmbridge adds such a way to its grouped GEMM; not part of the test suite.

Usage: python3 bench/probes/lt_pointer_array.py [--shapes qwen3-zipf,dsv3-zipf] [--reps 30]
"""
import argparse
import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import peer  # noqa: E402  (Clock, time_fn)

import torch  # noqa: E402

peer.torch = torch  # peer's Clock reads its module's torch

lt = ctypes.CDLL("libcublasLt.so.13")
vp = ctypes.c_void_p
R_32F, R_16F, R_16BF, COMPUTE_32F = 0, 2, 14, 68
TRANSA, TRANSB = 3, 4  # cublasLtMatmulDescAttributes_t
BATCH_COUNT, BATCH_MODE, POINTER_ARRAY = 5, 8, 1  # cublasLtMatrixLayoutAttribute_t, cublasLtBatchMode_t
PREF_MAX_WORKSPACE = 1
WS = 32 << 20


class Heur(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("ws", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def ck(s, what):
    if s != 0:
        raise RuntimeError(f"{what}: cuBLAS status {s}")


def layout(dtype, rows, cols, ld, count):
    h = vp()
    ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(h), dtype, ctypes.c_uint64(rows), ctypes.c_uint64(cols),
                                     ctypes.c_int64(ld)), "layout")
    for attr, val in [(BATCH_COUNT, ctypes.c_int(count)), (BATCH_MODE, ctypes.c_int(POINTER_ARRAY))]:
        ck(lt.cublasLtMatrixLayoutSetAttribute(h, attr, ctypes.byref(val), ctypes.sizeof(val)), f"layout attr {attr}")
    return h


class Chunked:
    """y_c[s, N] = x_c[s, K] · w_e[N, K]ᵀ for every chunk c of s rows, one pointer-array matmul per s:
    column-major D[N, s] = op_T(A = w_e, [K, N], ld K) · op_N(B = x_c, [K, s], ld K), D ld N."""

    def __init__(self, h, x, w, y, sizes, ws, dtype):
        n, k = w.shape[1], w.shape[2]
        el = x.element_size()
        chunks = {}  # rows per chunk -> [(x, w, y) addresses]
        start = 0
        for e, m in enumerate(sizes):
            r = start
            for s in [128, 64, 32, 16, 8, 4, 2, 1]:
                while start + m - r >= s:
                    chunks.setdefault(s, []).append((x.data_ptr() + r * k * el, w[e].data_ptr(), y.data_ptr() + r * n * el))
                    r += s
            start += m
        self.h, self.ws, self.calls = h, ws, []
        for s, ptrs in sorted(chunks.items(), reverse=True):
            d = vp()
            ck(lt.cublasLtMatmulDescCreate(ctypes.byref(d), COMPUTE_32F, R_32F), "desc")
            for attr, val in [(TRANSA, ctypes.c_int(1)), (TRANSB, ctypes.c_int(0))]:
                ck(lt.cublasLtMatmulDescSetAttribute(d, attr, ctypes.byref(val), ctypes.sizeof(val)), "desc attr")
            c = len(ptrs)
            la, lb, ld = layout(dtype, k, n, k, c), layout(dtype, k, s, k, c), layout(dtype, n, s, n, c)
            arrays = [torch.tensor([p[i] for p in ptrs], dtype=torch.int64, device="cuda") for i in (1, 0, 2)]
            pref = vp()
            ck(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
            wsb = ctypes.c_uint64(WS)
            ck(lt.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE, ctypes.byref(wsb), 8), "pref attr")
            heur, found = Heur(), ctypes.c_int(0)
            ck(lt.cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, ld, ld, pref, 1, ctypes.byref(heur),
                                                 ctypes.byref(found)), f"heuristic ({c} chunks of {s} rows)")
            if found.value == 0:
                raise RuntimeError(f"no algorithm for {c} chunks of {s} rows")
            self.calls.append((d, la, lb, ld, arrays, heur))

    def __call__(self):
        one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
        stream = vp(torch.cuda.current_stream().cuda_stream)
        for d, la, lb, ld, (pa, pb, pd), heur in self.calls:
            a, b, dd = vp(pa.data_ptr()), vp(pb.data_ptr()), vp(pd.data_ptr())
            ck(lt.cublasLtMatmul(self.h, d, ctypes.byref(one), a, la, b, lb, ctypes.byref(zero), dd, ld, dd, ld,
                                 ctypes.byref(heur.algo), vp(self.ws.data_ptr()), ctypes.c_size_t(WS), stream),
               "matmul")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen3-zipf,dsv3-zipf,qwen3,dsv3")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "grouped.json")) as fh:
        shapes = {s["name"]: s for s in json.load(fh)["shapes"]}
    h = vp()
    ck(lt.cublasLtCreate(ctypes.byref(h)), "create")
    print("cublasLtGetVersion", lt.cublasLtGetVersion())
    ws = torch.empty(WS, dtype=torch.uint8, device="cuda")
    for name in args.shapes.split(","):
        s = shapes[name]
        for dt, code in [(torch.bfloat16, R_16BF), (torch.float16, R_16F)]:
            m, n, k = sum(s["sizes"]), s["n"], s["k"]
            x = torch.randn(m, k, device="cuda", dtype=dt)
            w = torch.randn(s["e"], n, k, device="cuda", dtype=dt)
            y = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
            try:
                chunked = Chunked(h, x, w, y, s["sizes"], ws, code)
                chunked()
                torch.cuda.synchronize()
            except RuntimeError as e:
                print(f"{name} {dt}: refused: {e}")
                continue
            want = torch.cat([xi.float() @ w[i].float().t() for i, xi in enumerate(x.split(s["sizes"]))])
            err = ((y.float() - want).norm() / want.norm()).item()
            offs = torch.tensor(s["sizes"], device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
            ours, _ = peer.time_fn(chunked, peer.Clock("cuda"), args.reps)
            theirs, _ = peer.time_fn(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs),
                                     peer.Clock("cuda"), args.reps)
            tf = lambda ms: 2.0 * m * n * k / (ms * 1e-3) / 1e12  # noqa: E731
            print(f"{name} {str(dt)[6:]}: {len(chunked.calls)} pointer-array matmuls, rel error {err:.2e}; "
                  f"{ours:.3f} ms ({tf(ours):.0f} TFLOP/s) against torch._grouped_mm {theirs:.3f} ms "
                  f"({tf(theirs):.0f} TFLOP/s): ratio {theirs / ours:.3f}")


if __name__ == "__main__":
    main()
