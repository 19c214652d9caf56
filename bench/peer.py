#!/usr/bin/env python3
"""PyTorch peer for `gemmbridge bench`: PyTorch's own dense GEMM paths (cuBLAS / cuBLASLt
underneath) timed on the same shapes, dtypes and layouts, the same way, written as the same
JSON lines, so the two can be run side by side on one GPU machine and compared with
`gemmbridge bench --peer FILE` or `gemmbridge compare --ours ... --peer ...`.

Output: one JSON object per line (stdout, or --out FILE). The first line is an "env" row
(op "env": torch, CUDA, cuBLAS, cuBLASLt and cuDNN versions where they can be read, device
name, reps). Then one row per (dtype, shape, op), in that order:
  op         matmul (x[m,k] @ w[k,n]), linear (F.linear(x, w[n,k])), linear_bias
             (torch.addmm(bias, x, w.t()), what F.linear(x, w, bias) runs),
             linear_bias_gelu (torch._addmm_activation(bias, x, w.t(), use_gelu=True):
             PyTorch's fused bias + tanh-GELU path)
  dtype      f32 | tf32 | f16 | bf16  (input and output dtype; f32 accumulation)
  m, n, k    row-major problem, out[m,n]; batch is always 1
  median_ms, min_ms  device time per call (CUDA events), after 5 warm-up calls
  tflops     2*m*n*k / median time, in TFLOP/s
For dtype fp8_e4m3 the ops do not apply: one row per (shape, scaling) instead, op
"scaled_mm", with a "scaling" field naming the recipe (--scalings): x[m,k] and w[n,k]
quantised to float8_e4m3fn by PyTorch ops before the timing starts, then only
torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16) is timed:
  tensorwise  one float32 scale per tensor
  rowwise     one scale per row of x ([m,1]) and per row of w (passed as [1,n])
  block       DeepSeek-style: x in 1x128 blocks along k, w in 128x128 blocks
(block_1x128 and block_128x128_1x128 pair the block shapes otherwise). Shapes whose m, n
or k is not a multiple of 16 are skipped with a note: _scaled_mm needs 16-multiples.
And, last, one "launch" row per dtype (tf32 and fp8_e4m3 excepted, as gemmbridge): a tiny
64^3 matmul's
  host_us    host time per call, median of 40 batches of 256 calls
  wall_us    the same, waiting for the GPU at the end of each batch
  graph_us   GPU time per GEMM when 256 calls captured in one CUDA graph are replayed
A row that fails (e.g. out of memory) is written with an "error" field instead of times,
and the exit status is then 1.

Timing: each sample times `inner` back-to-back calls between two CUDA events, `inner`
chosen so that a sample spans about 1 ms (1 to 1000 calls); --reps samples; median and
minimum per call. With --gap-ms G, the GPU is drained and left idle for G ms before each
row's warm-up, so every row starts from the same idle state (gemmbridge bench --gap-ms G
does the same; the env row records it). Inputs are drawn with torch.randn on the GPU (never zeros) and rotated
across up to 8 buffer sets within 512 MiB (FP8 operands count 1 byte an element), drawn
afresh for every row, so that repeated calls do not all hit L2.

--accuracy DIR instead compares FP8 accuracy with gemmbridge's: DIR holds meta.json
({"m", "n", "k", "recipes"}), x.f32 [m,k] and w.f32 [n,k] (raw little-endian float32,
row-major) and ours_R.f32 [m,n] per recipe R (gemmbridge's bf16 result widened to
float32). Per recipe, PyTorch quantises x and w itself and runs _scaled_mm; both results
are measured against the float64 product x @ w.t() (relative Frobenius error), and one
"fp8_accuracy" line per recipe is written.

Needs only PyTorch and the standard library (Python 3.10+).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

# (m, n, k) row-major: out[m,n] = x[m,k] @ w  (w is [k,n] for matmul, [n,k] for linear)
SUITES = {
    "square": [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192)],
    "llm": [
        (5120, 2048, 768),  # production shape (m=5120 k=768 n=2048)
        (5120, 8192, 2048),  # production shape (m=5120 k=2048 n=8192)
        (3537, 12288, 2048),  # odd-M projection shape (m not a multiple of 8)
        (4096, 6144, 4096),  # 8B-class attention QKV projection, 4096 tokens
        (4096, 28672, 4096),  # 8B-class gate+up projection
        (4096, 4096, 14336),  # 8B-class down projection
    ],
    "small": [(1, 4096, 4096), (16, 4096, 4096), (128, 4096, 4096), (64, 64, 64), (256, 256, 256)],
    # Leading dimensions (row-major: k for x, n or k for w, n for out) that are not
    # multiples of 16 bytes in some operand. (4095, 4096, 4096) is the control: only the
    # m extent is odd, every leading dimension is aligned.
    "misaligned": [
        (4096, 4096, 2047),
        (4096, 4096, 4095),
        (4096, 4095, 4096),
        (8192, 8192, 8191),
        (4095, 4096, 4096),
        (2048, 2048, 2047),
        (1024, 1024, 1023),
        (512, 512, 511),
        (256, 256, 255),
    ],
    # DeepSeek-V3's block-scaled FP8 shape that DeepGEMM publishes a figure for
    "deepgemm": [(4096, 7168, 16384)],
}
SUITES["default"] = SUITES["square"] + SUITES["llm"] + SUITES["small"]
SUITE_ORDER = ["default", "square", "llm", "small", "misaligned", "deepgemm"]

# the default --dtypes, as `gemmbridge bench`'s; fp8_e4m3 runs when asked for
DEFAULT_DTYPES = ["f32", "tf32", "f16", "bf16"]
FP8 = "fp8_e4m3"
DTYPES = DEFAULT_DTYPES + [FP8]
OPS = ["matmul", "linear", "linear_bias", "linear_bias_gelu", "bmm"]
ALL_OPS = OPS + ["launch"]
# what runs without --ops, as `gemmbridge bench`'s default: bmm only when asked for
DEFAULT_OPS = ["matmul", "linear", "linear_bias", "linear_bias_gelu", "launch"]
# bmm: torch.bmm over this many contiguous [m,k] @ [k,n] pairs, as gemmbridge's bmm op
BMM_BATCH = 4
ELEM_BYTES = {"f32": 4, "tf32": 4, "f16": 2, "bf16": 2, FP8: 1}

# FP8 recipes: how x [m,k] and w [n,k] are scaled. "tensor": one scale; "row": one per row;
# "1x128": one per row and 128-wide block of k; "128x128": one per 128x128 block.
RECIPES = {
    "tensorwise": ("tensor", "tensor"),
    "rowwise": ("row", "row"),
    "block": ("1x128", "128x128"),  # DeepSeek style
    "block_1x128": ("1x128", "1x128"),
    "block_128x128_1x128": ("128x128", "1x128"),
}
SCALINGS = list(RECIPES)
DEFAULT_SCALINGS = ["tensorwise", "rowwise", "block"]  # the benchmark's (and gemmbridge's) default
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_BLOCK = 128
FP8_MULTIPLE = 16  # _scaled_mm needs m, n and k multiples of 16

WARMUP = 5
SAMPLE_MS = 1.0
# idle GPU before each row's warm-up, ms (--gap-ms; gemmbridge bench's --gap-ms does the same)
GAP_MS = 0.0
ROTATION_BYTES = 512 << 20
ROTATION_MAX = 8
LAUNCH_BATCH = 256
LAUNCH_BATCHES = 40
LAUNCH_GRAPH_REPS = 20

torch = None  # imported in main(), so that --list and argument errors need no PyTorch


class UsageError(Exception):
    """A bad command line: message, exit status 2."""


def op_applies(op, dtype):
    """Whether `op` runs for `dtype`: the fused linear ops only for f16/bf16."""
    return not (op.startswith("linear_bias") and dtype in ("f32", "tf32"))


def split_list(flag, text, known):
    """A comma list, in the order given, each name once; unknown names are a usage error."""
    out = []
    for name in (s.strip() for s in text.split(",")):
        if not name:
            continue
        if name not in known:
            raise UsageError(f"unknown {flag[2:].rstrip('s')} {name!r}; choose from {', '.join(known)}")
        if name not in out:
            out.append(name)
    if not out:
        raise UsageError(f"no {flag[2:]} to run: give {flag} with at least one of {', '.join(known)}")
    return out


def rotation_count(m, n, k, elem_bytes):
    """Buffer sets to rotate through: as many (x, w) pairs as fit 512 MiB, 1 to 8."""
    per = (m * k + k * n) * elem_bytes
    return max(1, min(ROTATION_MAX, ROTATION_BYTES // max(per, 1)))


def fp8_shape_ok(m, n, k):
    """Whether _scaled_mm takes the shape: m, n and k all multiples of 16."""
    return all(v > 0 and v % FP8_MULTIPLE == 0 for v in (m, n, k))


def ceil_div(a, b):
    return -(-a // b)


def round_up(a, b):
    return ceil_div(a, b) * b


def scale_layout(recipe_side, rows, k):
    """The scale tensor of one FP8 operand as _scaled_mm takes it: (shape, strides, storage),
    storage being the elements to allocate (padding included). `recipe_side` is (recipe,
    "x" or "w"); the operand is [rows, k] row-major (x: rows = m, w: rows = n). x's scale is
    scale_a; w's is scale_b, which belongs to wq.t() [k, n], hence the transposed layouts:
      tensor   () both
      row      x [m,1]; w [1,n] contiguous
      1x128    x [m, kb] strides (1, m); w [kb, n] strides (n, 1)   (kb = ceil(k/128))
      128x128  x [mb, kb] strides (kb4, 1); w [kb, nb] strides (1, kb4), the columns
               kb..kb4 of each row (k-blocks padded to kb4 = round_up(kb, 4)) zero.
    (PyTorch 2.11 takes the 128x128 layouts only where kb is a multiple of 4, the padding
    then empty, or the operand is one 128-row block. Elsewhere it wants them unpadded, and
    then computes wrong results, so these are kept and its refusal becomes an error row.)"""
    recipe, side = recipe_side
    kind = RECIPES[recipe][0 if side == "x" else 1]
    kb = ceil_div(k, FP8_BLOCK)
    if kind == "tensor":
        return (), (), 1
    if kind == "row":
        return ((rows, 1), (1, 1), rows) if side == "x" else ((1, rows), (rows, 1), rows)
    if kind == "1x128":
        return ((rows, kb), (1, rows), rows * kb) if side == "x" else ((kb, rows), (rows, 1), rows * kb)
    rb, kb4 = ceil_div(rows, FP8_BLOCK), round_up(kb, 4)
    return ((rb, kb), (kb4, 1), rb * kb4) if side == "x" else ((kb, rb), (1, kb4), rb * kb4)


def leading_dims(op, m, n, k):
    """Row-major leading dimensions (elements) of x, w and out for `op`."""
    return {"x": k, "w": n if op == "matmul" else k, "out": n}


def misaligned_operands(m, n, k, elem_bytes):
    """Operands whose row-major leading dimension is not a multiple of 16 bytes."""
    bad = []
    for op in ("matmul", "linear"):
        for operand, ld in leading_dims(op, m, n, k).items():
            tag = f"w({op})" if operand == "w" else operand
            if (ld * elem_bytes) % 16 and tag not in bad:
                bad.append(tag)
    return bad


def list_suites(out):
    """Prints every suite's shapes, with the operands whose leading dimension is not a
    multiple of 16 bytes."""
    for name in SUITE_ORDER:
        shapes = SUITES[name]
        out.write(f"{name} ({len(shapes)} shapes)\n")
        for m, n, k in shapes:
            b16, b32 = misaligned_operands(m, n, k, 2), misaligned_operands(m, n, k, 4)
            if not b16 and not b32:
                note = "leading dimensions all 16-byte multiples"
            elif b16 == b32:
                note = "ld not a 16-byte multiple: " + ", ".join(b16)
            else:
                note = f"ld not a 16-byte multiple: f16/bf16 {', '.join(b16) or '-'}; f32 {', '.join(b32) or '-'}"
            out.write(f"  m={m:<6} n={n:<6} k={k:<6} {note}\n")
    out.write("dtypes: " + ", ".join(DTYPES) + " (default " + ",".join(DEFAULT_DTYPES)
              + "; linear_bias, linear_bias_gelu: f16, bf16 only; fp8_e4m3: scaled_mm rows, one per "
              + "scaling, for shapes whose m, n, k are multiples of 16)\n")
    out.write("scalings: " + ", ".join(SCALINGS) + " (default " + ",".join(DEFAULT_SCALINGS) + ")\n")
    out.write("ops: " + ", ".join(ALL_OPS) + " (launch: 64x64x64, once per dtype but tf32 and fp8_e4m3, "
              "whatever the suite)\n")


def emit(out, rec):
    out.write(json.dumps(rec, allow_nan=False) + "\n")
    out.flush()


def torch_dtype(name):
    return {"f32": torch.float32, "tf32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[name]


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on


class Clock:
    """Device timing: CUDA events on the current stream, or the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device == "cuda"
        if self.cuda:
            self.s = torch.cuda.Event(enable_timing=True)
            self.e = torch.cuda.Event(enable_timing=True)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def burst(self, fn, n):
        """Milliseconds of `n` back-to-back calls."""
        if self.cuda:
            self.s.record()
            for _ in range(n):
                fn()
            self.e.record()
            self.e.synchronize()
            return self.s.elapsed_time(self.e)
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) * 1e3


def checked_gap_ms(ms):
    """A --gap-ms value as the peers use it (-0 as 0); UsageError outside 0..60000 ms or NaN.
    gemmbridge's timing.rs check_ms is its twin."""
    if not 0 <= ms <= 60_000:  # (NaN fails both comparisons)
        raise UsageError(f"--gap-ms {ms} is not between 0 and 60000 (milliseconds)")
    return ms + 0.0


def add_timing_args(ap):
    """--reps, --gap-ms and --out, as the per-capability peers (attn_peer.py, conv_peer.py,
    grouped_peer.py) take them."""
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="idle GPU time before each row's warm-up, ms (as gemmbridge bench --gap-ms)")
    ap.add_argument("--out")


def add_round_args(ap):
    """--rounds and --between: several runs from one process, the other side's command between
    them, so that a peer whose functions take long to compile (torch.compile) alternates with
    gemmbridge on one warm GPU without compiling again for each run."""
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs to make, each a run of its own in --out (lines tagged {\"run\": N} when above 1)")
    ap.add_argument("--between", default="",
                    help="shell command run after each run, {round} replaced by the run's number "
                         "(e.g. the gemmbridge bench of the same rows writing ours-{round}.jsonl)")


class _Tagged:
    """A text stream that tags every JSON object line with {"run": n} before writing it on."""

    def __init__(self, inner, n):
        self.inner, self.n, self.buf = inner, n, ""

    def write(self, text):
        self.buf += text
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            if line.startswith("{"):
                line = json.dumps(dict(run=self.n, **json.loads(line)))
            self.inner.write(line + "\n")

    def flush(self):
        self.inner.flush()


def alternate(a, one_run):
    """Calls one_run(out) --rounds times, each run's lines tagged with its number when there are
    several, and runs --between after each (its failure is reported, not fatal). The largest
    status one_run returned."""
    if a.rounds < 1:
        raise UsageError("--rounds needs at least 1")
    base = open(a.out, "w") if a.out else sys.stdout
    rc = 0
    for n in range(1, a.rounds + 1):
        rc = max(rc, one_run(_Tagged(base, n) if a.rounds > 1 else base) or 0)
        base.flush()
        if a.between:
            done = subprocess.run(a.between.replace("{round}", str(n)), shell=True, check=False)
            if done.returncode:
                print(f"--between (run {n}) exited with {done.returncode}", file=sys.stderr, flush=True)
    if base is not sys.stdout:
        base.close()
    return rc


def use_timing_args(a):
    """Sets GAP_MS from --gap-ms; UsageError for a bad --gap-ms or a --reps below 1."""
    global GAP_MS
    GAP_MS = checked_gap_ms(a.gap_ms)
    if a.reps < 1:
        raise UsageError("--reps needs at least 1")


def time_fn(fn, clock, reps, warmup=WARMUP, sample_ms=SAMPLE_MS, check=None, gap_ms=None):
    """Median and minimum time per call, ms: `gap_ms` (default GAP_MS) of idle GPU, `warmup`
    calls, one timed call to size a sample, then `reps` samples of `inner` back-to-back
    calls (~`sample_ms` each). `check`, if given, is called with the first warm-up call's
    result."""
    gap_ms = GAP_MS if gap_ms is None else gap_ms
    if gap_ms > 0:
        clock.sync()
        time.sleep(gap_ms / 1e3)
    for i in range(warmup):
        r = fn()
        if i == 0 and check is not None:
            check(r)
        del r
    clock.sync()
    once = max(clock.burst(fn, 1), 1e-3)
    inner = max(1, min(1000, int(sample_ms / once)))
    times = sorted(clock.burst(fn, inner) / inner for _ in range(reps))
    return times[len(times) // 2], times[0]


def op_batch(op):
    """The batch count of `op`'s rows (BMM_BATCH for bmm, else 1)."""
    return BMM_BATCH if op == "bmm" else 1


def rotation(m, n, k, name, op, device):
    """Input sets for one row: x [m,k], w [k,n] (matmul) or [n,k] (linear ops), contiguous,
    each with a leading batch dimension for bmm, drawn with torch.randn (in f32, then
    converted) on `device`."""
    dtype = torch_dtype(name)
    b = op_batch(op)
    count = rotation_count(m, n, k, ELEM_BYTES[name] * b)
    wshape = (k, n) if op in ("matmul", "bmm") else (n, k)
    lead = (b,) if op == "bmm" else ()
    xs = [torch.randn(*lead, m, k, device=device).to(dtype) for _ in range(count)]
    ws = [torch.randn(*lead, *wshape, device=device).to(dtype) for _ in range(count)]
    return xs, ws


def check_layout(op, m, n, k, x, w, y):
    """The operands have exactly the row-major leading dimensions of the problem: nothing
    padded or transposed behind our back."""
    ld = leading_dims("matmul" if op == "bmm" else op, m, n, k)
    wshape = (k, n) if op in ("matmul", "bmm") else (n, k)
    for what, t, shape, want in (("x", x, (m, k), ld["x"]), ("w", w, wshape, ld["w"]), ("out", y, (m, n), ld["out"])):
        if op == "bmm":  # a contiguous batch: each entry one matrix after the other
            if tuple(t.shape[1:]) != shape or t.stride() != (shape[0] * shape[1], want, 1):
                raise RuntimeError(f"{what} of bmm {m}x{n}x{k} has shape {tuple(t.shape)} strides {t.stride()}")
            continue
        if tuple(t.shape) != shape or t.stride() != (want, 1):
            raise RuntimeError(
                f"{what} of {op} {m}x{n}x{k} has shape {tuple(t.shape)} strides {t.stride()}, "
                f"expected shape {shape} strides ({want}, 1)"
            )


def bench_row(op, name, m, n, k, reps, device):
    """One timed row."""
    xs, ws = rotation(m, n, k, name, op, device)
    bias = torch.randn(n, device=device).to(torch_dtype(name))
    F = torch.nn.functional

    if op == "matmul":
        def gemm(x, w):
            return x @ w
    elif op == "linear":
        def gemm(x, w):
            return F.linear(x, w)
    elif op == "linear_bias":
        def gemm(x, w):
            return torch.addmm(bias, x, w.t())
    elif op == "bmm":
        def gemm(x, w):
            return torch.bmm(x, w)
    else:
        def gemm(x, w):
            return torch._addmm_activation(bias, x, w.t(), use_gelu=True)

    it = [0]

    def call():
        i = it[0] = (it[0] + 1) % len(xs)
        return gemm(xs[i], ws[i])

    def check(y):
        check_layout(op, m, n, k, xs[1 % len(xs)], ws[1 % len(ws)], y)

    med, mn = time_fn(call, Clock(device), reps, check=check)
    if not (med > 0 and mn > 0):
        raise RuntimeError(f"time per call {med} ms is not positive")
    b = op_batch(op)
    return dict(op=op, dtype=name, m=m, n=n, k=k, batch=b, median_ms=med, min_ms=mn,
                tflops=2 * m * n * k * b / (med * 1e-3) / 1e12)


def fp8_cast(v):
    """`v` (already divided by its scales) clamped to the E4M3 range and cast to it."""
    return v.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def dequant_factor(amax):
    """The scale of a group whose largest magnitude is `amax`: amax / 448, or 1 for an
    all-zero group."""
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def quantize(t, recipe_side):
    """One operand `t` ([rows, k]: x, or w as [n, k]) quantised per `recipe_side` = (recipe,
    "x" or "w"): (q, scale), q float8_e4m3fn [rows, k] contiguous, scale the float32
    dequantisation factors (amax / 448 per group) in the layout of scale_layout(), as
    _scaled_mm takes it for that side. q = clamp(t / scale, -448, 448) cast to E4M3."""
    recipe, side = recipe_side
    kind = RECIPES[recipe][0 if side == "x" else 1]
    t = t.float()
    rows, k = t.shape
    kb, rb = ceil_div(k, FP8_BLOCK), ceil_div(rows, FP8_BLOCK)
    if kind == "tensor":
        s = dequant_factor(t.abs().amax())
        q = fp8_cast(t / s)
    elif kind == "row":
        s = dequant_factor(t.abs().amax(dim=1, keepdim=True))  # [rows, 1]
        q = fp8_cast(t / s)
    elif kind == "1x128":
        p = torch.nn.functional.pad(t, (0, kb * FP8_BLOCK - k)).view(rows, kb, FP8_BLOCK)
        s = dequant_factor(p.abs().amax(dim=2))  # [rows, kb]
        q = fp8_cast(p / s[:, :, None]).view(rows, kb * FP8_BLOCK)[:, :k].contiguous()
    else:
        p = torch.nn.functional.pad(t, (0, kb * FP8_BLOCK - k, 0, rb * FP8_BLOCK - rows))
        p = p.view(rb, FP8_BLOCK, kb, FP8_BLOCK)
        s = dequant_factor(p.abs().amax(dim=(1, 3)))  # [rb, kb]
        q = fp8_cast(p / s[:, None, :, None]).view(rb * FP8_BLOCK, kb * FP8_BLOCK)[:rows, :k].contiguous()
    shape, strides, storage = scale_layout(recipe_side, rows, k)
    scale = torch.zeros(storage, dtype=torch.float32, device=t.device).as_strided(shape, strides)
    scale.copy_(s if side == "x" or kind == "tensor" else s.t())
    return q, scale


def operand_scales(scale, recipe_side, rows, k):
    """The inverse of quantize()'s layout: the dequantisation factor of every element of the
    [rows, k] operand (for checks: q.float() * operand_scales(...) is the dequantised
    operand)."""
    recipe, side = recipe_side
    kind = RECIPES[recipe][0 if side == "x" else 1]
    s = scale if side == "x" or kind == "tensor" else scale.t()
    if kind in ("tensor", "row"):
        return s.expand(rows, k)
    s = s.repeat_interleave(FP8_BLOCK, dim=1)[:, :k]
    if kind == "128x128":
        s = s.repeat_interleave(FP8_BLOCK, dim=0)[:rows]
    return s


def scaled_mm(xq, sx, wq, sw):
    """y[m,n] = (xq * sx) @ (wq * sw).t() in bf16: torch._scaled_mm with w's transpose
    (column-major [k, n]) as mat2, f32 accumulation (use_fast_accum off)."""
    return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16)


def fp8_rotation(m, n, k, scaling, device):
    """Quantised input sets for one scaled_mm row: x [m,k] and w [n,k] drawn with torch.randn
    (f32) on `device` and quantised per `scaling`; (xq, sx, wq, sw) each."""
    sets = []
    for _ in range(rotation_count(m, n, k, ELEM_BYTES[FP8])):
        xq, sx = quantize(torch.randn(m, k, device=device), (scaling, "x"))
        wq, sw = quantize(torch.randn(n, k, device=device), (scaling, "w"))
        sets.append((xq, sx, wq, sw))
    return sets


def fp8_row(scaling, m, n, k, reps, device):
    """One timed scaled_mm row: only the _scaled_mm call is timed."""
    sets = fp8_rotation(m, n, k, scaling, device)
    it = [0]

    def call():
        i = it[0] = (it[0] + 1) % len(sets)
        return scaled_mm(*sets[i])

    def check(y):
        if tuple(y.shape) != (m, n) or y.stride() != (n, 1) or y.dtype != torch.bfloat16:
            raise RuntimeError(f"scaled_mm {scaling} {m}x{n}x{k} returned {y.dtype} of shape "
                               f"{tuple(y.shape)} strides {y.stride()}, expected bf16 ({m}, {n}) strides ({n}, 1)")

    med, mn = time_fn(call, Clock(device), reps, check=check)
    if not (med > 0 and mn > 0):
        raise RuntimeError(f"time per call {med} ms is not positive")
    return dict(op="scaled_mm", dtype=FP8, scaling=scaling, m=m, n=n, k=k, batch=1, median_ms=med,
                min_ms=mn, tflops=2 * m * n * k / (med * 1e-3) / 1e12)


def launch_row(name):
    """Cost of one tiny (64^3) matmul, as gemmbridge's launch row: host and wall time per
    call over batches of 256 calls (below the launch-queue depth, so the GPU does not
    throttle the host), median of 40 batches; GPU time per GEMM when 256 calls captured in
    one CUDA graph are replayed, median of 20 replays."""
    set_tf32(False)
    dtype = torch_dtype(name)
    x = torch.randn(64, 64, device="cuda").to(dtype)
    w = torch.randn(64, 64, device="cuda").to(dtype)
    o = torch.empty(64, 64, device="cuda", dtype=dtype)
    for _ in range(200):
        torch.matmul(x, w, out=o)
    hosts, walls = [], []
    for _ in range(LAUNCH_BATCHES):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(LAUNCH_BATCH):
            torch.matmul(x, w, out=o)
        hosts.append((time.perf_counter() - t) / LAUNCH_BATCH)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) / LAUNCH_BATCH)
    hosts.sort()
    walls.sort()
    g = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            torch.matmul(x, w, out=o)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for _ in range(LAUNCH_BATCH):
            torch.matmul(x, w, out=o)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    e0 = torch.cuda.Event(enable_timing=True)
    e1 = torch.cuda.Event(enable_timing=True)
    graph = []
    for _ in range(LAUNCH_GRAPH_REPS):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        graph.append(e0.elapsed_time(e1) / LAUNCH_BATCH * 1e3)
    graph.sort()
    return dict(op="launch", dtype=name, m=64, n=64, k=64,
                host_us=hosts[LAUNCH_BATCHES // 2] * 1e6, wall_us=walls[LAUNCH_BATCHES // 2] * 1e6,
                graph_us=graph[LAUNCH_GRAPH_REPS // 2])


def loaded_library(stem):
    """Path of a shared library `stem`*.so* this process has loaded (Linux), else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith(stem + ".so"):
                    return path
    except OSError:
        pass
    return None


def cublas_versions():
    """(cuBLAS "major.minor.patch", cuBLASLt version number) of the libraries PyTorch has
    loaded, read through ctypes; None where they cannot be read (PyTorch does not expose
    them). Call after a GEMM has run, so that both are loaded."""
    import ctypes

    blas = lt = None
    path = loaded_library("libcublas")
    if path:
        try:
            lib = ctypes.CDLL(path)
            parts = []
            for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                v = ctypes.c_int()
                if lib.cublasGetProperty(prop, ctypes.byref(v)) != 0:
                    raise OSError("cublasGetProperty failed")
                parts.append(str(v.value))
            blas = ".".join(parts)
        except (OSError, AttributeError):
            blas = None
    path = loaded_library("libcublasLt")
    if path:
        try:
            lib = ctypes.CDLL(path)
            lib.cublasLtGetVersion.restype = ctypes.c_size_t
            lt = int(lib.cublasLtGetVersion())
        except (OSError, AttributeError):
            lt = None
    return blas, lt


def cudnn_env(reps, **extra):
    """The "env" row of the peers beside cuDNN-backed rows (attention, convolutions, RMSNorm,
    the decoder layer, decoding): PyTorch's, CUDA's and cuDNN's versions, the device, the
    sample count and the idle gap, and `extra` fields."""
    return dict(op="env", backend="torch", torch=torch.__version__, cuda=torch.version.cuda,
                cudnn=torch.backends.cudnn.version(), device=torch.cuda.get_device_name(0), reps=reps,
                gap_ms=GAP_MS, **extra)


def env_row(device, reps, suite):
    """The "env" row: as gemmbridge's (op, backend, device, cublas, cublaslt, reps, heat_ms,
    gap_ms) plus PyTorch's own versions and matmul flags."""
    row = dict(op="env", backend="torch", torch=torch.__version__, cuda=torch.version.cuda, suite=suite,
               reps=reps, heat_ms=0.0, gap_ms=GAP_MS)
    if device == "cuda":
        # one small GEMM of each kind, so that cuBLAS and cuBLASLt are loaded
        a = torch.randn(64, 64, device="cuda", dtype=torch.float16)
        a @ a
        torch._addmm_activation(torch.randn(64, device="cuda", dtype=torch.float16), a, a.t(), use_gelu=True)
        torch.cuda.synchronize()
        blas, lt = cublas_versions()
        row.update(device=torch.cuda.get_device_name(0), cublas=blas, cublaslt=lt)
        try:
            row["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # cuDNN missing or not loadable: say so rather than fail
            row["cudnn"] = None
        cap = torch.cuda.get_device_capability(0)
        row["capability"] = f"{cap[0]}.{cap[1]}"
        row["allow_fp16_reduced_precision_reduction"] = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
        row["allow_bf16_reduced_precision_reduction"] = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    else:
        row.update(device="cpu", cublas=None, cublaslt=None, cudnn=None)
    return row


class InputError(Exception):
    """A missing or malformed --accuracy input: message, exit status 2."""


def accuracy_inputs(d):
    """meta.json of an --accuracy folder, checked: (m, n, k, recipes)."""
    if not os.path.isdir(d):
        raise InputError(f"--accuracy {d}: no such directory")
    path = os.path.join(d, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise InputError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: expected a JSON object with m, n, k and recipes")
    dims = []
    for key in ("m", "n", "k"):
        v = meta.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise InputError(f"{path}: {key!r} must be a positive integer, got {v!r}")
        dims.append(v)
    recipes = meta.get("recipes")
    if not isinstance(recipes, list) or not recipes:
        raise InputError(f"{path}: 'recipes' must be a non-empty list of recipe names")
    for r in recipes:
        if r not in RECIPES:
            raise InputError(f"{path}: unknown recipe {r!r}; this peer knows {', '.join(SCALINGS)}")
    return dims[0], dims[1], dims[2], list(dict.fromkeys(recipes))


def accuracy_files(d, m, n, k, recipes):
    """The float32 files an --accuracy folder must hold: (path, rows, cols) each."""
    files = [(os.path.join(d, "x.f32"), m, k), (os.path.join(d, "w.f32"), n, k)]
    return files + [(os.path.join(d, f"ours_{r}.f32"), m, n) for r in recipes]


def check_files(files):
    """Every file present with exactly rows * cols * 4 bytes, else an InputError naming it."""
    for path, rows, cols in files:
        want = rows * cols * 4
        try:
            size = os.path.getsize(path)
        except OSError:
            raise InputError(f"{path} is missing: expected {want} bytes ([{rows}, {cols}] float32)") from None
        if size != want:
            raise InputError(f"{path} has {size} bytes, expected {want} ([{rows}, {cols}] float32)")


def read_f32(path, rows, cols, device):
    """A raw row-major float32 file (little-endian, as the host) as a [rows, cols] tensor."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.float32).reshape(rows, cols).to(device)


def rel_err(got, ref):
    """||got - ref|| / ||ref|| (Frobenius, float64); None where it is not finite."""
    e = (torch.linalg.vector_norm(got.double() - ref) / torch.linalg.vector_norm(ref)).item()
    return e if math.isfinite(e) else None


def accuracy_row(recipe, x, w, ours, ref):
    """One "fp8_accuracy" line: PyTorch's and gemmbridge's relative errors for `recipe`."""
    (m, k), n = x.shape, w.shape[0]
    row = dict(op="fp8_accuracy", scaling=recipe, m=m, n=n, k=k)
    try:
        xq, sx = quantize(x, (recipe, "x"))
        wq, sw = quantize(w, (recipe, "w"))
        theirs = rel_err(scaled_mm(xq, sx, wq, sw), ref)
        del xq, wq
    except (RuntimeError, NotImplementedError) as e:
        theirs = None
        row["torch_error"] = first_line(e)
    ours_err = rel_err(ours, ref)
    if "torch_error" not in row:
        row["torch_rel_err"] = theirs
    row["ours_rel_err"] = ours_err
    if "torch_error" not in row:
        row["ratio"] = ours_err / theirs if ours_err is not None and theirs else None
    return row


def run_accuracy(a):
    """--accuracy DIR: one fp8_accuracy line per recipe of DIR/meta.json."""
    m, n, k, recipes = accuracy_inputs(a.accuracy)
    files = accuracy_files(a.accuracy, m, n, k, recipes)
    check_files(files)
    rc = import_torch(a.device)
    if rc:
        return rc
    if a.device == "cpu":
        print("note: --device cpu exercises the code paths only; _scaled_mm may not run there",
              file=sys.stderr)
    try:
        out = sys.stdout if a.out == "-" else open(a.out, "w")
    except OSError as e:
        print(f"error: cannot write {a.out}: {e}", file=sys.stderr)
        return 2
    try:
        x = read_f32(files[0][0], m, k, a.device)
        w = read_f32(files[1][0], n, k, a.device)
        ref = x.double() @ w.double().t()
        for recipe, (path, _, _) in zip(recipes, files[2:]):
            emit(out, accuracy_row(recipe, x, w, read_f32(path, m, n, a.device), ref))
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="peer.py",
        description="PyTorch peer for `gemmbridge bench`: times PyTorch's GEMMs on the same suites "
        "and writes the same JSON lines; with --accuracy, compares FP8 accuracy with gemmbridge's.",
        epilog="Unknown suites, dtypes, scalings or ops, a missing or malformed --accuracy input, and "
        "a missing CUDA GPU, exit with status 2.",
    )
    ap.add_argument("--suite", default="default", metavar="NAME", help=f"shape suite: {', '.join(SUITE_ORDER)} (default: default)")
    ap.add_argument("--dtypes", default=",".join(DEFAULT_DTYPES), metavar="LIST",
                    help=f"comma list of {', '.join(DTYPES)} (default: {','.join(DEFAULT_DTYPES)}); "
                    "fp8_e4m3 times torch._scaled_mm (op scaled_mm, bf16 output), one row per "
                    "--scalings recipe, on shapes whose m, n and k are multiples of 16; --ops does "
                    "not apply to it")
    ap.add_argument("--scalings", default=",".join(DEFAULT_SCALINGS), metavar="LIST",
                    help="FP8 recipes for fp8_e4m3 rows, comma list of tensorwise (one scale per "
                    "tensor), rowwise (per row of x and of w), block (x in 1x128, w in 128x128 "
                    "blocks), block_1x128, block_128x128_1x128 (x 128x128, w 1x128) "
                    f"(default: {','.join(DEFAULT_SCALINGS)})")
    ap.add_argument("--ops", default=",".join(DEFAULT_OPS), metavar="LIST",
                    help="comma list of matmul, linear, linear_bias, linear_bias_gelu, launch (default: all; "
                    "the linear_bias ops run only for f16/bf16; launch runs once per dtype but tf32 and "
                    "fp8_e4m3, whatever the suite)")
    ap.add_argument("--reps", type=int, default=30, metavar="N", help="timed samples per row, ~1 ms each (default 30)")
    ap.add_argument("--gap-ms", type=float, default=0.0, metavar="MS",
                    help="idle GPU time before each row's warm-up, ms (default 0); give gemmbridge bench "
                    "the same --gap-ms")
    ap.add_argument("--out", default="-", metavar="FILE", help="write the JSON lines to FILE (default: stdout)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cuda (default). cpu only exercises the code paths: its timings are NOT "
                    "meaningful and must not be compared; launch and fp8_e4m3 rows are skipped there")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="print the suites' shapes and exit (needs no PyTorch)")
    mode.add_argument("--accuracy", metavar="DIR",
                      help="instead of timing, compare FP8 accuracy: DIR holds meta.json, x.f32, w.f32 "
                      "and ours_RECIPE.f32 per recipe, as gemmbridge writes them; one fp8_accuracy line "
                      "per recipe, PyTorch's and gemmbridge's relative error against the float64 product "
                      "(--suite, --dtypes, --scalings, --ops and --reps are ignored)")
    return ap.parse_args(argv)


def first_line(e):
    """An exception's message, first line, at most 300 characters (its type if empty)."""
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def import_torch(device):
    """Imports PyTorch into the module; 0, or 2 (with a message) where it or the GPU is missing."""
    global torch
    try:
        import torch as _torch
    except ImportError as e:
        print(f"error: PyTorch is not installed ({e})", file=sys.stderr)
        return 2
    torch = _torch
    if device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU visible to PyTorch (torch.cuda.is_available() is False; "
              f"torch {torch.__version__}, built for CUDA {torch.version.cuda})", file=sys.stderr)
        return 2
    return 0


def fp8_rows(out, shapes, scalings, reps, device):
    """The scaled_mm rows of the suite's `shapes`, in order, one per scaling; the number of
    rows that failed."""
    failed = 0
    for (m, n, k) in shapes:
        if not fp8_shape_ok(m, n, k):
            print(f"note: {FP8} {m}x{n}x{k} skipped: _scaled_mm needs m, n and k multiples of "
                  f"{FP8_MULTIPLE}", file=sys.stderr)
            continue
        for scaling in scalings:
            try:
                rec = fp8_row(scaling, m, n, k, reps, device)
            except (RuntimeError, NotImplementedError) as e:
                failed += 1
                msg = first_line(e)
                print(f"error: scaled_mm {FP8} {scaling} {m}x{n}x{k}: {msg}", file=sys.stderr)
                rec = dict(op="scaled_mm", dtype=FP8, scaling=scaling, m=m, n=n, k=k, batch=1, error=msg)
            emit(out, rec)
    return failed


def run(a):
    if a.list:
        list_suites(sys.stdout)
        return 0
    if a.accuracy is not None:
        return run_accuracy(a)
    if a.suite not in SUITES:
        raise UsageError(f"unknown suite {a.suite!r}; choose one of {', '.join(SUITE_ORDER)}")
    dtypes = split_list("--dtypes", a.dtypes, DTYPES)
    scalings = split_list("--scalings", a.scalings, SCALINGS)
    ops = split_list("--ops", a.ops, ALL_OPS)
    if not 1 <= a.reps <= 100_000:
        raise UsageError(f"--reps {a.reps} is not between 1 and 100000")
    global GAP_MS
    GAP_MS = checked_gap_ms(a.gap_ms)
    rc = import_torch(a.device)
    if rc:
        return rc
    launch = "launch" in ops
    ops = [o for o in ops if o != "launch"]
    if launch and a.device == "cpu":
        print("note: launch rows need a GPU; skipped on --device cpu", file=sys.stderr)
        launch = False
    if FP8 in dtypes and a.device == "cpu":
        print(f"note: {FP8} rows need torch._scaled_mm on a CUDA GPU; skipped on --device cpu", file=sys.stderr)
        dtypes.remove(FP8)
    if a.device == "cpu":
        print("note: --device cpu exercises the code paths only; its timings are not meaningful",
              file=sys.stderr)

    try:
        out = sys.stdout if a.out == "-" else open(a.out, "w")
    except OSError as e:
        print(f"error: cannot write {a.out}: {e}", file=sys.stderr)
        return 2
    failed = 0
    try:
        emit(out, env_row(a.device, a.reps, a.suite))
        for name in dtypes:
            set_tf32(name == "tf32")
            if name == FP8:
                failed += fp8_rows(out, SUITES[a.suite], scalings, a.reps, a.device)
                continue
            for (m, n, k) in SUITES[a.suite]:
                for op in ops:
                    if not op_applies(op, name):
                        continue
                    try:
                        rec = bench_row(op, name, m, n, k, a.reps, a.device)
                    except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
                        failed += 1
                        msg = first_line(e)
                        print(f"error: {op} {name} {m}x{n}x{k}: {msg}", file=sys.stderr)
                        rec = dict(op=op, dtype=name, m=m, n=n, k=k, batch=op_batch(op), error=msg)
                    emit(out, rec)
        set_tf32(False)
        if launch:
            for name in dtypes:
                if name in ("tf32", FP8):
                    continue
                emit(out, launch_row(name))
    finally:
        if out is not sys.stdout:
            out.close()
    return 1 if failed else 0


def main(argv=None):
    try:
        return run(parse_args(argv))
    except (UsageError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
