"""Probe: which cuBLAS / cuBLASLt calls PyTorch makes for a few rows, and their descriptors.

Run with the libraries' own API logs on, e.g.

    CUBLASLT_LOG_LEVEL=5 CUBLASLT_LOG_FILE=/tmp/lt.log CUBLAS_LOGINFO_DBG=1 \
    CUBLAS_LOGDEST_DBG=/tmp/blas.log python3 bench/probes/torch_lt_trace.py

Each row runs a few times after a warm-up marker line (printed to stdout) so the logs can be
split per row. Rows: matmul (x[m,k] @ w[k,n]) and linear (x @ w[n,k].T) in bf16 and f16 at
3537x12288x2048 and 4096^3; torch._scaled_mm row-wise at 4096^3.
"""
import os
import sys

import torch


def mark(name):
    torch.cuda.synchronize()
    print(f"=== {name}", flush=True)
    for path in (os.environ.get("CUBLASLT_LOG_FILE"), os.environ.get("CUBLAS_LOGDEST_DBG")):
        if path and path not in ("stdout", "stderr"):
            try:
                with open(path, "a") as f:
                    f.write(f"=== {name}\n")
            except OSError:
                pass


def main():
    torch.manual_seed(0)
    dev = "cuda"
    print("torch", torch.__version__, "blas backend", torch.backends.cuda.preferred_blas_library(), flush=True)
    for dtype in (torch.bfloat16, torch.float16):
        for m, n, k in ((3537, 12288, 2048), (4096, 4096, 4096)):
            x = torch.randn(m, k, device=dev, dtype=dtype)
            w_kn = torch.randn(k, n, device=dev, dtype=dtype)
            w_nk = torch.randn(n, k, device=dev, dtype=dtype)
            b = torch.randn(n, device=dev, dtype=dtype)
            mark(f"matmul {dtype} {m}x{n}x{k}")
            for _ in range(2):
                torch.matmul(x, w_kn)
            mark(f"linear {dtype} {m}x{n}x{k}")
            for _ in range(2):
                torch.nn.functional.linear(x, w_nk)
            mark(f"linear_bias {dtype} {m}x{n}x{k}")
            for _ in range(2):
                torch.nn.functional.linear(x, w_nk, b)
    m = n = k = 4096
    x = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
    sx = torch.rand(m, 1, device=dev) + 0.5
    sw = torch.rand(1, n, device=dev) + 0.5
    mark("scaled_mm rowwise 4096^3")
    for _ in range(2):
        torch._scaled_mm(x, w.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)
    st = torch.ones((), device=dev)
    mark("scaled_mm tensorwise 4096^3")
    for _ in range(2):
        torch._scaled_mm(x, w.t(), scale_a=st, scale_b=st, out_dtype=torch.bfloat16)
    mark("end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
