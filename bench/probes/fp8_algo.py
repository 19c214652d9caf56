"""Why one FP8 row differs from PyTorch's: for row-wise and block scales at a given shape, the
algorithm cuBLASLt's heuristic returns (its id, tile, stages, split-K) and its time, under
gemmbridge's query (C = D, alignment classes told, 32 MiB) and under variants (C separate,
no alignments told, 1 MiB / 4 MiB workspace), beside torch._scaled_mm. ctypes over the
system cuBLASLt; not part of the test suite."""
import ctypes, sys, torch

lt = ctypes.CDLL("libcublasLt.so.13")
vp = ctypes.c_void_p
def ck(s, w):
    if s != 0: raise RuntimeError(f"{w}: status {s}")
h = vp(); ck(lt.cublasLtCreate(ctypes.byref(h)), "create")
E4M3, R16BF, R32F = 28, 14, 0
OUTER, VEC128, BLK = 3, 4, 5
class Heur(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("ws", ctypes.c_size_t), ("state", ctypes.c_int), ("waves", ctypes.c_float), ("r", ctypes.c_int * 4)]
def setd(d, a, v): ck(lt.cublasLtMatmulDescSetAttribute(d, a, ctypes.byref(v), ctypes.sizeof(v)), f"attr {a}")
def cfg(algo):
    out = []
    for attr in range(9):  # ID, TILE, SPLITK, REDUCTION, SWIZZLE, CUSTOM, STAGES, INNER_SHAPE, CLUSTER_SHAPE
        v = ctypes.c_uint64(0); n = ctypes.c_size_t(0)
        lt.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(v), 8, ctypes.byref(n))
        out.append(v.value)
    return "id%d tile%d splitk%d red%d swz%d custom%d stages%d inner%d cluster%d" % tuple(out)

def run(M, N, K, amode, bmode, c_separate, aligns, ws_bytes, reps=50):
    x = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    y = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16) if c_separate else y
    sa = torch.ones(1 << 20, device="cuda"); sb = torch.ones(1 << 20, device="cuda")
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
    d = vp(); ck(lt.cublasLtMatmulDescCreate(ctypes.byref(d), 68, R32F), "desc")
    setd(d, 3, ctypes.c_int(1)); setd(d, 4, ctypes.c_int(0))
    setd(d, 17, vp(sb.data_ptr())); setd(d, 18, vp(sa.data_ptr()))
    setd(d, 31, ctypes.c_int(amode)); setd(d, 32, ctypes.c_int(bmode))
    la, lb, lc, ld = vp(), vp(), vp(), vp()
    ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(la), E4M3, ctypes.c_uint64(K), ctypes.c_uint64(N), ctypes.c_int64(K)), "la")
    ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lb), E4M3, ctypes.c_uint64(K), ctypes.c_uint64(M), ctypes.c_int64(K)), "lb")
    ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lc), R16BF, ctypes.c_uint64(N), ctypes.c_uint64(M), ctypes.c_int64(N)), "lc")
    ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(ld), R16BF, ctypes.c_uint64(N), ctypes.c_uint64(M), ctypes.c_int64(N)), "ld")
    p = vp(); ck(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(p)), "pref")
    wb = ctypes.c_uint64(ws_bytes); ck(lt.cublasLtMatmulPreferenceSetAttribute(p, 1, ctypes.byref(wb), 8), "ws")
    if aligns:
        for attr, v in zip((5, 6, 7, 8), aligns):
            vv = ctypes.c_uint32(v); ck(lt.cublasLtMatmulPreferenceSetAttribute(p, attr, ctypes.byref(vv), 4), "align")
    res = (Heur * 8)(); found = ctypes.c_int(0)
    ck(lt.cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, ld, p, 8, res, ctypes.byref(found)), "heur")
    a1, b0 = ctypes.c_float(1.0), ctypes.c_float(0.0)
    out = []
    for i in range(found.value):
        call = lambda: ck(lt.cublasLtMatmul(h, d, ctypes.byref(a1), vp(w.data_ptr()), la, vp(x.data_ptr()), lb, ctypes.byref(b0),
                                            vp(c.data_ptr()), lc, vp(y.data_ptr()), ld, ctypes.byref(res[i].algo), vp(ws.data_ptr()),
                                            ctypes.c_size_t(ws_bytes), vp(torch.cuda.current_stream().cuda_stream)), "matmul")
        for _ in range(5): call()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(15):
            s.record()
            for _ in range(reps): call()
            e.record(); e.synchronize(); times.append(s.elapsed_time(e) / reps)
        times.sort()
        out.append((times[len(times) // 2], cfg(res[i].algo), res[i].ws))
    return out

def torch_time(M, N, K, recipe, reps=50):
    x = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    if recipe == "rowwise":
        sa, sb = torch.ones(M, 1, device="cuda"), torch.ones(1, N, device="cuda")
    else:
        kb = K // 128; kb4 = -(-kb // 4) * 4
        sa = torch.ones(kb, M, device="cuda").t()
        sb = torch.ones(N // 128, kb4, device="cuda").t()[:kb]
    f = lambda: torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    for _ in range(5): f()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(15):
        s.record()
        for _ in range(reps): f()
        e.record(); e.synchronize(); times.append(s.elapsed_time(e) / reps)
    times.sort(); return times[len(times) // 2]

shapes = [(4096, 4096, 4096), (4096, 28672, 4096), (8192, 8192, 8192)]
for (M, N, K) in shapes:
    for name, (am, bm) in (("rowwise", (OUTER, OUTER)), ("block", (BLK, VEC128))):
        try:
            print(f"{name} {M}x{N}x{K} torch._scaled_mm {torch_time(M, N, K, name):.4f} ms", flush=True)
        except Exception as ex:
            print(f"{name} {M}x{N}x{K} torch error {str(ex)[:120]}", flush=True)
        for label, cs, al, wsb in (("gemmbridge (C=D, align 256/256/256/256, 32 MiB)", False, (256, 256, 256, 256), 32 << 20),
                                   ("C separate, no alignment, 32 MiB", True, None, 32 << 20),
                                   ("C=D, no alignment, 32 MiB", False, None, 32 << 20),
                                   ("C separate, no alignment, 1 MiB", True, None, 1 << 20),
                                   ("C separate, no alignment, 4 MiB", True, None, 4 << 20)):
            try:
                for t, c, wsn in run(M, N, K, am, bm, cs, al, wsb):
                    print(f"  {label}: {t:.4f} ms {c} ws {wsn}", flush=True)
            except Exception as ex:
                print(f"  {label}: error {ex}", flush=True)
