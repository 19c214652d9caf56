"""Which FP8 configurations the system cuBLASLt accepts on this GPU (heuristic + one launch),
through ctypes, and which `torch._scaled_mm` recipe signatures PyTorch takes. Prints one line
per configuration. Used to write gemmbridge's FP8 rules down; not part of the test suite."""
import ctypes, itertools, sys

lt = ctypes.CDLL("libcublasLt.so.13")
rt = ctypes.CDLL("libcudart.so.13")
vp = ctypes.c_void_p
print("cublasLtGetVersion", lt.cublasLtGetVersion())

def ck(s, what):
    if s != 0:
        raise RuntimeError(f"{what} status {s}")

def malloc(n):
    p = vp(); ck(rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(max(n, 256))), "cudaMalloc")
    ck(rt.cudaMemset(p, 0, ctypes.c_size_t(max(n, 256))), "cudaMemset"); return p

h = vp(); ck(lt.cublasLtCreate(ctypes.byref(h)), "create")
R_32F, R_16F, R_16BF, E4M3, E5M2 = 0, 2, 14, 28, 29
SIZE = {R_32F: 4, R_16F: 2, R_16BF: 2, E4M3: 1, E5M2: 1}
COMPUTE_32F = 68
SCALAR, OUTER, VEC128, BLK = 0, 3, 4, 5
WS = 32 << 20
ws = malloc(WS)

class Heur(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("ws", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]

def setd(d, attr, val):
    ck(lt.cublasLtMatmulDescSetAttribute(d, attr, ctypes.byref(val), ctypes.sizeof(val)), f"desc attr {attr}")

def scale_elems(mode, rows, k):
    # rows: the operand's outer (M or N) dimension
    if mode == SCALAR: return 1
    if mode == OUTER: return rows
    if mode == VEC128: return rows * -(-k // 128)
    return (-(-(-(-k // 128)) // 4) * 4) * -(-rows // 128)

def probe(m_rows, n_rows, k, ta, tb, out, amode, bmode, beta, bias, fast, trans=True):
    """Row-major y[M,N] = x[M,K]·w[N,K]^T as cuBLASLt D[N,M] = op_T(A=w) op_N(B=x)."""
    M, N = m_rows, n_rows
    d = vp(); ck(lt.cublasLtMatmulDescCreate(ctypes.byref(d), COMPUTE_32F, R_32F), "descCreate")
    setd(d, 3, ctypes.c_int(1 if trans else 0)); setd(d, 4, ctypes.c_int(0))
    a_s = malloc(4 * scale_elems(amode, N, k)); b_s = malloc(4 * scale_elems(bmode, M, k))
    setd(d, 17, a_s); setd(d, 18, b_s)
    if amode != SCALAR or bmode != SCALAR:
        setd(d, 31, ctypes.c_int(amode)); setd(d, 32, ctypes.c_int(bmode))
    ctype = out if out not in (E4M3, E5M2) else R_16BF
    if out in (E4M3, E5M2):
        setd(d, 20, malloc(4)); setd(d, 21, malloc(4))
    if fast: setd(d, 25, ctypes.c_int8(1))
    if bias:
        setd(d, 7, ctypes.c_int(4)); setd(d, 8, malloc(4 * N))
        setd(d, 26, ctypes.c_int(bias))
    A = malloc(N * k); B = malloc(M * k); C = malloc(M * N * SIZE[ctype]); D = malloc(M * N * SIZE[out]) if ctype != out else C
    la, lb, lc, ld = vp(), vp(), vp(), vp()
    if trans:
        ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(la), ta, ctypes.c_uint64(k), ctypes.c_uint64(N), ctypes.c_int64(k)), "la")
    else:
        ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(la), ta, ctypes.c_uint64(N), ctypes.c_uint64(k), ctypes.c_int64(N)), "la")
    ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lb), tb, ctypes.c_uint64(k), ctypes.c_uint64(M), ctypes.c_int64(k)), "lb")
    ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(lc), ctype, ctypes.c_uint64(N), ctypes.c_uint64(M), ctypes.c_int64(N)), "lc")
    ck(lt.cublasLtMatrixLayoutCreate(ctypes.byref(ld), out, ctypes.c_uint64(N), ctypes.c_uint64(M), ctypes.c_int64(N)), "ld")
    pref = vp(); ck(lt.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
    wsb = ctypes.c_uint64(WS); ck(lt.cublasLtMatmulPreferenceSetAttribute(pref, 1, ctypes.byref(wsb), 8), "pref ws")
    res = (Heur * 8)(); found = ctypes.c_int(0)
    s = lt.cublasLtMatmulAlgoGetHeuristic(h, d, la, lb, lc, ld, pref, 8, res, ctypes.byref(found))
    if s != 0 or found.value == 0:
        return f"heuristic status {s} found {found.value}"
    alpha = ctypes.c_float(1.0); bet = ctypes.c_float(beta)
    s = lt.cublasLtMatmul(h, d, ctypes.byref(alpha), A, la, B, lb, ctypes.byref(bet), C, lc, D, ld,
                          ctypes.byref(res[0].algo), ws, ctypes.c_size_t(WS), vp(0))
    s2 = rt.cudaDeviceSynchronize()
    return f"ok ({found.value} algos) run {s} sync {s2}"

NAMES = {R_32F: "f32", R_16F: "f16", R_16BF: "bf16", E4M3: "e4m3", E5M2: "e5m2"}
MODES = {SCALAR: "scalar", OUTER: "outer", VEC128: "vec128", BLK: "blk128"}
base = dict(m_rows=256, n_rows=256, k=256, ta=E4M3, tb=E4M3, out=R_16BF, amode=SCALAR, bmode=SCALAR, beta=0.0, bias=0, fast=False)
cases = []
for ta, tb in [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3), (E5M2, E5M2)]:
    cases.append(dict(base, ta=ta, tb=tb))
for am, bm in [(OUTER, OUTER), (VEC128, VEC128), (BLK, VEC128), (VEC128, BLK), (BLK, BLK), (SCALAR, OUTER), (OUTER, SCALAR)]:
    for ta, tb in [(E4M3, E4M3), (E4M3, E5M2)]:
        cases.append(dict(base, amode=am, bmode=bm, ta=ta, tb=tb))
for am, bm in [(SCALAR, SCALAR), (OUTER, OUTER), (BLK, VEC128), (VEC128, VEC128)]:
    for out in (R_16BF, R_16F, R_32F, E4M3, E5M2):
        cases.append(dict(base, amode=am, bmode=bm, out=out))
    for beta in (1.0,):
        for out in (R_16BF, R_32F):
            cases.append(dict(base, amode=am, bmode=bm, out=out, beta=beta))
    for bias, out in [(R_16BF, R_16BF), (R_32F, R_16BF), (R_32F, R_32F), (R_16BF, E4M3), (R_16F, R_16F)]:
        cases.append(dict(base, amode=am, bmode=bm, out=out, bias=bias))
    cases.append(dict(base, amode=am, bmode=bm, fast=True))
    for M in (72, 70, 1, 129):
        cases.append(dict(base, amode=am, bmode=bm, m_rows=M))
    for N in (264, 260):
        cases.append(dict(base, amode=am, bmode=bm, n_rows=N))
    for k in (200, 208, 384):
        cases.append(dict(base, amode=am, bmode=bm, k=k))
    cases.append(dict(base, amode=am, bmode=bm, trans=False))
for c in cases:
    label = (f"M{c['m_rows']} N{c['n_rows']} K{c['k']} {NAMES[c['ta']]}x{NAMES[c['tb']]} out {NAMES[c['out']]} "
             f"A(w) {MODES[c['amode']]} B(x) {MODES[c['bmode']]} beta {c['beta']} bias {NAMES.get(c['bias'], 'none')} "
             f"fast {int(c['fast'])} {'TN' if c.get('trans', True) else 'NN'}")
    try:
        r = probe(**c)
    except Exception as e:
        r = f"error {e}"
    print(f"{label}: {r}", flush=True)

# PyTorch's recipe signatures, on the same small shape
try:
    import torch
    M, N, K = 256, 512, 384
    x = torch.randn(M, K, device="cuda"); w = torch.randn(N, K, device="cuda")
    f8 = torch.float8_e4m3fn
    xq, wq = x.to(f8), w.to(f8)
    one = torch.ones((), device="cuda")
    y = torch._scaled_mm(xq, wq.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16); print("torch tensorwise ok", tuple(y.shape))
    y = torch._scaled_mm(xq, wq.t(), scale_a=torch.ones(M, 1, device="cuda"), scale_b=torch.ones(1, N, device="cuda"), out_dtype=torch.bfloat16); print("torch rowwise ok")
    sa = torch.ones(K // 128, M, device="cuda").t()           # [M, K/128], strides (1, M)
    kb4 = -(-(K // 128) // 4) * 4
    sb = torch.ones(N // 128, kb4, device="cuda").t()          # [round4(K/128), N/128], strides (1, round4)
    y = torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16); print("torch block 1x128 x 128x128 ok")
    y = torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=torch.ones(K // 128, N, device="cuda").t(), out_dtype=torch.bfloat16); print("torch block 1x128 x 1x128 ok")
except Exception as e:
    print("torch:", repr(e)[:400])
