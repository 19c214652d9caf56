#!/usr/bin/env python3
"""What cuDNN's MoE grouped matmul (CUDNN_BACKEND_OPERATION_MOE_GROUPED_MATMUL_DESCRIPTOR, through
cudnn-frontend's Python graph) does on this GPU, and how fast, beside torch._grouped_mm.

Part 1, support and correctness: modes none / gather / scatter; bf16, f16, f32 and E4M3 tokens
and weights; the weight's two layouts ([E, K, N] with K contiguous, as documented, and with N
contiguous, which would serve the backward data without a transposed copy); every group of every
product checked against float64 (‖out − ref‖ / ‖ref‖), the output poisoned with NaN first, so
rows a mode should not write are seen; empty groups, groups of one row; gather with repeated
and missing token indices; scatter with a full and a partial (token, k) cover.
Part 2, device offsets under a CUDA graph: one execution captured, then the offsets and the
data rewritten in place and the graph replayed: the result must be the new routing's.
Part 3, timing on bench/grouped.json's bf16 shapes: the forward and the backward data through
the MoE operation (every candidate plan) beside torch._grouped_mm, and the cost of the
transposed weight copy; the kernels both run (torch.profiler) on the skewed Qwen3 shape.

Needs cuDNN 9.18 or later (PyTorch's nvidia/cudnn/lib first on LD_LIBRARY_PATH) and
cudnn-frontend's Python package (nvidia-cudnn-frontend 1.18, which has no dependencies).
Prints one JSON line per case, then a summary. Not part of the test suite.

Usage: python3 bench/probes/moe_grouped.py [--part support,capture,timing] [--shapes NAME,...]
"""
import argparse
import json
import os
import sys
import time

import torch
import cudnn

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = json.load(open(os.path.join(HERE, "..", "grouped.json")))["shapes"]
F32 = cudnn.data_type.FLOAT
CDT = {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF,
       torch.float32: cudnn.data_type.FLOAT, torch.float8_e4m3fn: cudnn.data_type.FP8_E4M3}
# cudnn-frontend 1.18 binds the enum without exporting it at the package's top level
_MODE = getattr(cudnn, "moe_grouped_matmul_mode", None) or cudnn._pybind_module.moe_grouped_matmul_mode
MODES = {"none": _MODE.NONE, "gather": _MODE.GATHER, "scatter": _MODE.SCATTER}
HANDLE = None


def out(**kw):
    print(json.dumps(kw), flush=True)


class Moe:
    """One MoE grouped matmul graph: tokens [1, rows, K], weight [E, K, N] at `wstride`,
    first-token offsets [E, 1, 1], output [1, out_rows, N] of `odt`."""

    def __init__(self, mode, rows, k, n, e, dt, odt, wstride, idx_rows=None, top_k=1, plans="heur"):
        g = cudnn.pygraph(intermediate_data_type=F32, compute_data_type=F32, handle=HANDLE)
        self.tok = g.tensor(name="token", dim=[1, rows, k], stride=[rows * k, k, 1], data_type=CDT[dt])
        self.w = g.tensor(name="weight", dim=[e, k, n], stride=list(wstride), data_type=CDT[dt])
        self.off = g.tensor(name="fto", dim=[e, 1, 1], stride=[1, 1, 1], data_type=cudnn.data_type.INT32)
        self.idx = self.ks = None
        if mode != "none":
            self.idx = g.tensor(name="index", dim=[1, idx_rows, 1], stride=[idx_rows, 1, 1],
                                data_type=cudnn.data_type.INT32)
        if mode == "scatter":
            self.ks = g.tensor(name="ks", dim=[1, idx_rows, 1], stride=[idx_rows, 1, 1],
                               data_type=cudnn.data_type.INT32)
        self.y = g.moe_grouped_matmul(self.tok, self.w, self.off, token_index=self.idx, token_ks=self.ks,
                                      mode=MODES[mode], compute_data_type=F32, top_k=top_k, name="moe")
        self.y.set_data_type(CDT[odt]).set_output(True)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans(cudnn.build_plan_policy.ALL if plans == "all" else cudnn.build_plan_policy.HEURISTICS_CHOICE)
        self.g = g
        self.ws = torch.empty(max(g.get_workspace_size(), 1), dtype=torch.uint8, device="cuda")
        self.ydims = self.y.get_dim()

    def pack(self, tok, w, off, y, idx=None, ks=None):
        p = {self.tok: tok, self.w: w, self.off: off, self.y: y}
        if self.idx is not None:
            p[self.idx] = idx
        if self.ks is not None:
            p[self.ks] = ks
        return p

    def run(self, pack, plan=None):
        cudnn.set_stream(handle=HANDLE, stream=torch.cuda.current_stream().cuda_stream)
        if plan is None:
            self.g.execute(pack, self.ws, handle=HANDLE)
        else:
            self.g.execute_plan_at_index(pack, self.ws, plan, handle=HANDLE)


def starts(sizes):
    s, acc = [], 0
    for v in sizes:
        s.append(acc)
        acc += v
    return s


def expert_of(sizes):
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))


def rel(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("nan")
    d = (a - b).norm().item()
    r = b.norm().item()
    return d / r if r > 0 else d


def quant(x, dt):
    if dt != torch.float8_e4m3fn:
        return x.to(dt)
    return x.clamp(-448, 448).to(dt)


def support_case(mode, dt, odt, wlayout, sizes, k, n, top_k=2):
    """One product, checked group by group against float64; returns the case's record."""
    e, rows = len(sizes), sum(sizes)
    rec = dict(part="support", mode=mode, dtype=str(dt).split(".")[-1], out=str(odt).split(".")[-1],
               weight=wlayout, e=e, k=k, n=n, rows=rows)
    torch.manual_seed(7)
    wl = torch.randn(e, n, k, device="cuda")  # logical w[e] is [K, N]: stored per layout
    if wlayout == "k-contiguous":
        w_store, wstride = quant(wl, dt).contiguous(), [k * n, 1, k]  # [E, N, K] memory
        w_log = w_store.double().transpose(1, 2)
    else:
        w_store, wstride = quant(wl.transpose(1, 2), dt).contiguous(), [k * n, n, 1]  # [E, K, N]
        w_log = w_store.double()
    off = torch.tensor(starts(sizes), dtype=torch.int32, device="cuda").reshape(e, 1, 1)
    ex = expert_of(sizes).cuda()
    idx = ks = None
    if mode == "gather":
        s_tokens = max(1, rows // 2)
        tok = quant(torch.randn(1, s_tokens, k, device="cuda"), dt)
        g = torch.Generator(device="cpu").manual_seed(3)
        idx = torch.randint(0, s_tokens, (rows,), generator=g)  # repeated and missing indices
        idx[: min(4, rows)] = 0
        src = tok[0].double()[idx.cuda()]
        idx = idx.to(torch.int32).cuda().reshape(1, rows, 1)
        moe = Moe(mode, s_tokens, k, n, e, dt, odt, wstride, idx_rows=rows)
        out_rows = rows
    elif mode == "scatter":
        s_tokens = rows // top_k
        tok = quant(torch.randn(1, rows, k, device="cuda"), dt)
        perm = torch.randperm(rows, generator=torch.Generator().manual_seed(5))
        idx = (perm // top_k).to(torch.int32)
        ks = (perm % top_k).to(torch.int32)
        src = tok[0].double()
        moe = Moe(mode, rows, k, n, e, dt, odt, wstride, idx_rows=rows, top_k=top_k)
        out_rows = rows
        dest = perm.cuda()
        idx, ks = idx.cuda().reshape(1, rows, 1), ks.cuda().reshape(1, rows, 1)
    else:
        tok = quant(torch.randn(1, rows, k, device="cuda"), dt)
        src = tok[0].double()
        moe = Moe(mode, rows, k, n, e, dt, odt, wstride)
        out_rows = rows
    rec["ydims"] = moe.ydims
    y = torch.full((1, out_rows, n), float("nan"), device="cuda", dtype=odt)
    moe.run(moe.pack(tok, w_store, off, y, idx, ks))
    torch.cuda.synchronize()
    ref = torch.einsum("rk,rkn->rn", src, w_log[ex]) if rows else torch.zeros(0, n, device="cuda").double()
    got = y[0].double()
    if mode == "scatter":
        got = got[dest]  # routed row r was written at idx·topK + ks
    errs, worst = [], 0.0
    for gi, (s0, sz) in enumerate(zip(starts(sizes), sizes)):
        if sz == 0:
            continue
        r = rel(got[s0:s0 + sz], ref[s0:s0 + sz])
        errs.append(r)
        worst = r if (r != r or r > worst) else worst
    rec.update(groups_checked=len(errs), worst_group_rel=worst,
               groups_over_band=sum(1 for r in errs if not r <= 2e-2),
               unwritten_rows=int(torch.isnan(y[0]).any(dim=1).sum().item()))
    return rec


def support(modes):
    sizes = [0, 1, 7, 0, 64, 129, 3, 300]
    for mode in modes:
        for dt, odt in [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                        (torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                        (torch.float8_e4m3fn, torch.bfloat16), (torch.float8_e4m3fn, torch.float16)]:
            for wl in ["k-contiguous", "n-contiguous"]:
                if mode != "none" and wl == "n-contiguous" and dt != torch.bfloat16:
                    continue
                try:
                    out(**support_case(mode, dt, odt, wl, sizes, 520, 248))
                except Exception as ex:  # refused: record why
                    torch.cuda.synchronize()
                    out(part="support", mode=mode, dtype=str(dt), out=str(odt), weight=wl,
                        refused=f"{type(ex).__name__}: {str(ex).splitlines()[0][:240] if str(ex) else ''}")
    # a partial scatter cover: rows not named stay as they were
    if "scatter" not in modes:
        return
    try:
        sizes = [5, 0, 11]
        rows, k, n, e = 16, 64, 32, 3
        tok = torch.randn(1, rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        moe = Moe("scatter", rows, k, n, e, torch.bfloat16, torch.bfloat16, [k * n, 1, k], idx_rows=rows, top_k=4)
        off = torch.tensor(starts(sizes), dtype=torch.int32, device="cuda").reshape(e, 1, 1)
        idx = torch.arange(rows, dtype=torch.int32, device="cuda").reshape(1, rows, 1) // 4
        ks = torch.zeros(1, rows, 1, dtype=torch.int32, device="cuda")  # only slot 0 of each token
        y = torch.full((1, rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        moe.run(moe.pack(tok, w, off, y, idx, ks))
        torch.cuda.synchronize()
        out(part="scatter-partial", nan_rows=int(torch.isnan(y[0]).any(dim=1).sum().item()),
            note="16 routed rows onto 4 distinct (token, 0) slots: 12 slots never named")
    except Exception as ex:
        out(part="scatter-partial", refused=str(ex)[:240])


def capture():
    """One execution captured; offsets and tokens rewritten in place; replay checked."""
    k, n, e, rows = 256, 128, 6, 640
    try:
        tok = torch.randn(1, rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        moe = Moe("none", rows, k, n, e, torch.bfloat16, torch.bfloat16, [k * n, 1, k])
        a = [100, 100, 100, 100, 100, 140]
        off = torch.tensor(starts(a), dtype=torch.int32, device="cuda").reshape(e, 1, 1)
        y = torch.full((1, rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        pack = moe.pack(tok, w, off, y)
        moe.run(pack)  # warm
        torch.cuda.synchronize()
        gr = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            with torch.cuda.graph(gr, stream=s):
                moe.run(pack)
        for trial, b in enumerate([[0, 600, 1, 0, 39, 0], [640, 0, 0, 0, 0, 0], [10, 20, 30, 40, 50, 490]]):
            off.copy_(torch.tensor(starts(b), dtype=torch.int32).reshape(e, 1, 1))
            tok.copy_(torch.randn(1, rows, k, device="cuda", dtype=torch.bfloat16))
            y.fill_(float("nan"))
            gr.replay()
            torch.cuda.synchronize()
            ex = expert_of(b).cuda()
            ref = torch.einsum("rk,rnk->rn", tok[0].double(), w.double()[ex])
            worst = max(rel(y[0][s0:s0 + z], ref[s0:s0 + z]) for s0, z in zip(starts(b), b) if z)
            out(part="capture", trial=trial, sizes=b, worst_group_rel=worst,
                unwritten_rows=int(torch.isnan(y[0]).any(dim=1).sum().item()))
    except Exception as ex:
        torch.cuda.synchronize()
        out(part="capture", refused=f"{type(ex).__name__}: {str(ex)[:300]}")


def time_fn(fn, reps=20, gap_ms=200):
    torch.cuda.synchronize()
    time.sleep(gap_ms / 1e3)
    for _ in range(5):
        fn()
    s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); fn(); t.record(); t.synchronize()
    inner = max(1, min(1000, int(1.0 / max(s.elapsed_time(t), 1e-3))))
    ts = []
    for _ in range(reps):
        s.record()
        for _ in range(inner):
            fn()
        t.record(); t.synchronize()
        ts.append(s.elapsed_time(t) / inner)
    ts.sort()
    return ts[len(ts) // 2]


def timing(names, plans):
    for sh in SHAPES:
        if names and sh["name"] not in names:
            continue
        e, n, k, sizes = sh["e"], sh["n"], sh["k"], sh["sizes"]
        m = sum(sizes)
        flop = 2.0 * m * n * k
        dt = torch.bfloat16
        x = torch.randn(m, k, device="cuda", dtype=dt)
        dy = torch.randn(m, n, device="cuda", dtype=dt)
        w = torch.randn(e, n, k, device="cuda", dtype=dt)
        ends = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
        off = torch.tensor(starts(sizes), dtype=torch.int32, device="cuda").reshape(e, 1, 1)
        rec = dict(part="timing", shape=sh["name"], m=m, n=n, k=k, e=e)
        rec["torch_fwd_ms"] = time_fn(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=ends))
        rec["torch_dx_ms"] = time_fn(lambda: torch._grouped_mm(dy, w, offs=ends))
        rec["transpose_ms"] = time_fn(lambda: w.transpose(1, 2).contiguous())
        wt = w.transpose(1, 2).contiguous()  # [E, K, N]
        for name, tok, wbuf, kk, nn, ws in [("fwd", x, w, k, n, [k * n, 1, k]),
                                            ("dx", dy, wt, n, k, [k * n, 1, n]),
                                            ("dx-ncontig", dy, w, n, k, [k * n, k, 1])]:
            try:
                moe = Moe("none", m, kk, nn, e, dt, dt, ws, plans=plans)
                y = torch.empty(1, m, nn, device="cuda", dtype=dt)
                pack = moe.pack(tok.reshape(1, m, kk), wbuf, off, y)
                cnt = moe.g.get_execution_plan_count() if plans == "all" else 1
                best = None
                for p in range(cnt):
                    try:
                        ms = time_fn(lambda: moe.run(pack, p if plans == "all" else None), reps=10)
                    except Exception as ex:
                        torch.cuda.synchronize()
                        rec[f"{name}_plan{p}_refused"] = str(ex)[:120]
                        continue
                    rec[f"{name}_plan{p}_ms"] = ms
                    best = ms if best is None else min(best, ms)
                rec[f"moe_{name}_ms"] = best
                # correctness of this product at full size, sampled groups
                ref_rows = [0, m // 2, m - 1]
                ex_ = expert_of(sizes)
                wl = wbuf.double()
                for r in ref_rows:
                    wr = wl[ex_[r]]
                    ref = tok[r].double() @ (wr.t() if ws[1] == 1 else wr)
                    rec[f"{name}_row{r}_rel"] = rel(y[0, r], ref)
            except Exception as ex:
                torch.cuda.synchronize()
                rec[f"moe_{name}_refused"] = f"{type(ex).__name__}: {str(ex)[:200]}"
        for key in ["fwd", "dx"]:
            t, mo = rec.get(f"torch_{key}_ms"), rec.get(f"moe_{key}_ms")
            if t and mo:
                rec[f"{key}_ratio_torch_over_moe"] = t / mo
                rec[f"moe_{key}_tflops"] = flop / (mo * 1e-3) / 1e12
        out(**rec)


def profile(name):
    sh = next(s for s in SHAPES if s["name"] == name)
    e, n, k, sizes = sh["e"], sh["n"], sh["k"], sh["sizes"]
    m = sum(sizes)
    dt = torch.bfloat16
    x = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(e, n, k, device="cuda", dtype=dt)
    ends = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    off = torch.tensor(starts(sizes), dtype=torch.int32, device="cuda").reshape(e, 1, 1)
    moe = Moe("none", m, k, n, e, dt, dt, [k * n, 1, k])
    y = torch.empty(1, m, n, device="cuda", dtype=dt)
    pack = moe.pack(x.reshape(1, m, k), w, off, y)
    for _ in range(5):
        moe.run(pack)
        torch._grouped_mm(x, w.transpose(-2, -1), offs=ends)
    torch.cuda.synchronize()
    from torch.profiler import profile as prof, ProfilerActivity
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            moe.run(pack)
        torch.cuda.synchronize()
        for _ in range(10):
            torch._grouped_mm(x, w.transpose(-2, -1), offs=ends)
        torch.cuda.synchronize()
    for ev in p.key_averages():
        if ev.device_type.name == "CUDA" or getattr(ev, "self_device_time_total", 0):
            t = getattr(ev, "self_device_time_total", 0) or getattr(ev, "self_cuda_time_total", 0)
            if t:
                out(part="profile", shape=name, kernel=ev.key[:160], calls=ev.count, us_per_call=t / ev.count)


def main():
    global HANDLE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", default="support,capture,timing,profile")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--plans", default="all", choices=["all", "heur"])
    ap.add_argument("--modes", default="none,gather,scatter",
                    help="support part's modes (gather faulted with an illegal address on an H100 with cuDNN 9.19: last)")
    a = ap.parse_args()
    out(part="env", cudnn_backend=cudnn.backend_version(), torch_cudnn=torch.backends.cudnn.version(),
        device=torch.cuda.get_device_name(), torch=torch.__version__)
    HANDLE = cudnn.create_handle()
    parts = a.part.split(",")
    if "support" in parts:
        support([m for m in a.modes.split(",") if m])
    if "capture" in parts:
        capture()
    if "timing" in parts:
        timing([s for s in a.shapes.split(",") if s], a.plans)
    if "profile" in parts:
        profile("qwen3-zipf")


if __name__ == "__main__":
    sys.exit(main())
