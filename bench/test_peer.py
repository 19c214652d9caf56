#!/usr/bin/env python3
"""Checks of bench/peer.py (and bench/norm_peer.py's, bench/decode_peer.py's and
bench/decode_step_peer.py's byte counts and usage errors) that need no GPU:
`python3 bench/test_peer.py`.

Without PyTorch: the suites against crates/gemmbridge-lab/src/suites.rs, the op/dtype rules,
the rotation count, --list, the usage errors (exit 2), the FP8 rules (--scalings, the
16-multiple shape rule, the scale layouts) and --accuracy's input checks (exit 2). With
PyTorch installed (any build), also a `--device cpu --reps 1` run on small shapes,
including misaligned ones: the rows' fields and types, the operands' strides, and the env
row; each recipe's quantisation; and an --accuracy run on the CPU. With a CUDA GPU that
runs FP8, also torch._scaled_mm with every recipe's scales, fp8_e4m3 rows and --accuracy
on the GPU.
"""

import importlib.util
import io
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")
RUST_SUITES = os.path.join(HERE, "..", "crates", "gemmbridge-lab", "src", "suites.rs")

spec = importlib.util.spec_from_file_location("peer", PEER)
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)

NORM_PEER = os.path.join(HERE, "norm_peer.py")
norm_spec = importlib.util.spec_from_file_location("norm_peer", NORM_PEER)
norm_peer = importlib.util.module_from_spec(norm_spec)
norm_spec.loader.exec_module(norm_peer)

DECODE_PEER = os.path.join(HERE, "decode_peer.py")
decode_spec = importlib.util.spec_from_file_location("decode_peer", DECODE_PEER)
decode_peer = importlib.util.module_from_spec(decode_spec)
decode_spec.loader.exec_module(decode_peer)

MOE_PEER = os.path.join(HERE, "moe_peer.py")
moe_spec = importlib.util.spec_from_file_location("moe_peer", MOE_PEER)
moe_peer = importlib.util.module_from_spec(moe_spec)
moe_spec.loader.exec_module(moe_peer)
DECODE_STEP_PEER = os.path.join(HERE, "decode_step_peer.py")
decode_step_spec = importlib.util.spec_from_file_location("decode_step_peer", DECODE_STEP_PEER)
decode_step_peer = importlib.util.module_from_spec(decode_step_spec)
decode_step_spec.loader.exec_module(decode_step_peer)

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def have_fp8_gpu():
    """A CUDA GPU of compute capability 8.9 or later (FP8 tensor cores)."""
    return HAVE_TORCH and torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 9)


def gpu_recipes():
    """The recipes _scaled_mm runs on this GPU: the block ones (1x128, 128x128) on SM90 only."""
    if torch.cuda.get_device_capability(0)[0] == 9:
        return list(peer.SCALINGS)
    return ["tensorwise", "rowwise"]

GEMM_FIELDS = {"op": str, "dtype": str, "m": int, "n": int, "k": int, "batch": int,
               "median_ms": float, "min_ms": float, "tflops": float}


def run_peer(*args):
    p = subprocess.run([sys.executable, PEER, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def run_main(args, shapes=None):
    """peer.main(args) in this process, --out to a temporary file, with the "small" suite
    replaced by `shapes` if given: (exit status, rows, stderr)."""
    saved = peer.SUITES.get("small")
    if shapes is not None:
        peer.SUITES["small"] = shapes
    err = io.StringIO()
    old = sys.stderr
    try:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.jsonl")
            sys.stderr = err
            rc = peer.main([*args, "--out", path])
            rows = []
            if os.path.exists(path):
                with open(path) as f:
                    rows = [json.loads(line) for line in f]
    finally:
        sys.stderr = old
        peer.SUITES["small"] = saved
    return rc, rows, err.getvalue()


def write_accuracy_dir(d, m, n, k, recipes, ours=None, skip=(), sizes=None):
    """An --accuracy folder: meta.json, x.f32, w.f32 and ours_R.f32 per recipe, as
    gemmbridge writes them. x and w are small integers (exact in f32); `ours(x, w)` gives
    the [m*n] values written for each recipe (zeros by default). Files named in `skip` are
    left out, `sizes` maps a file name to a byte count to truncate it to."""
    x = [float((i * 7) % 11 - 5) for i in range(m * k)]
    w = [float((i * 5) % 13 - 6) for i in range(n * k)]
    y = ours(x, w) if ours else [0.0] * (m * n)
    files = {"x.f32": x, "w.f32": w}
    files.update({f"ours_{r}.f32": y for r in recipes})
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump({"m": m, "n": n, "k": k, "seed": 1, "recipes": recipes}, f)
    for name, vals in files.items():
        if name in skip:
            continue
        data = struct.pack(f"<{len(vals)}f", *vals)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data[: (sizes or {}).get(name, len(data))])
    return x, w


def product(x, w, m, n, k):
    """x[m,k] @ w[n,k]^T in plain Python (float64), row-major [m*n]."""
    return [sum(x[i * k + p] * w[j * k + p] for p in range(k)) for i in range(m) for j in range(n)]


def rust_suite(name):
    """The shapes of a `pub const NAME: [Shape; N]` in suites.rs (None if it has none)."""
    with open(RUST_SUITES) as f:
        text = f.read()
    m = re.search(rf"pub const {name}: \[Shape; \d+\] = \[(.*?)\];", text, re.S)
    if m is None:
        return None
    body = re.sub(r"//[^\n]*", "", m.group(1))
    return [tuple(int(v) for v in t) for t in re.findall(r"\((\d+),\s*(\d+),\s*(\d+)\)", body)]


class NoTorch(unittest.TestCase):
    @unittest.skipUnless(os.path.exists(RUST_SUITES), "crates/gemmbridge-lab/src/suites.rs not found")
    def test_suites_match_gemmbridge(self):
        for name in ("square", "llm", "small", "deepgemm"):
            self.assertEqual(peer.SUITES[name], rust_suite(name.upper()), name)
        self.assertEqual(peer.SUITES["default"], rust_suite("SQUARE") + rust_suite("LLM") + rust_suite("SMALL"))
        # gemmbridge bench may not have the misaligned suite; where it does, the shapes agree
        theirs = rust_suite("MISALIGNED")
        if theirs is not None:
            self.assertEqual(peer.SUITES["misaligned"], theirs)

    def test_misaligned_suite(self):
        shapes = peer.SUITES["misaligned"]
        self.assertEqual(len(shapes), 9)
        self.assertEqual(len(set(shapes)), 9)
        for m, n, k in shapes:
            odd = peer.misaligned_operands(m, n, k, 2)
            # every shape but the odd-m control has an operand whose ld is not 16-byte aligned
            self.assertEqual(odd == [], (m, n, k) == (4095, 4096, 4096), (m, n, k))

    def test_op_rules(self):
        for d in ("f16", "bf16"):
            self.assertTrue(all(peer.op_applies(o, d) for o in peer.OPS))
        for d in ("f32", "tf32"):
            self.assertEqual([o for o in peer.OPS if peer.op_applies(o, d)], ["matmul", "linear", "bmm"])

    def test_rotation_count(self):
        self.assertEqual(peer.rotation_count(64, 64, 64, 2), 8)
        self.assertEqual(peer.rotation_count(8192, 8192, 8192, 4), 1)  # 512 MiB exactly
        self.assertEqual(peer.rotation_count(4096, 28672, 4096, 2), 2)

    def test_rotation_count_fp8(self):
        # FP8 operands count 1 byte an element
        self.assertEqual(peer.ELEM_BYTES["fp8_e4m3"], 1)
        self.assertEqual(peer.rotation_count(4096, 28672, 4096, peer.ELEM_BYTES["fp8_e4m3"]), 4)  # 128 MiB a set
        self.assertEqual(peer.rotation_count(8192, 8192, 8192, 1), 4)
        self.assertEqual(peer.rotation_count(16384, 16384, 16384, 1), 1)  # 512 MiB exactly
        self.assertEqual(peer.rotation_count(32768, 32768, 32768, 1), 1)  # more than fits: still one
        self.assertEqual(peer.rotation_count(4096, 4096, 4096, 1), 8)

    def test_fp8_dtype(self):
        self.assertIn("fp8_e4m3", peer.DTYPES)
        self.assertFalse(hasattr(peer, "SKIPPED_DTYPES"))
        self.assertEqual(peer.split_list("--dtypes", "fp8_e4m3,bf16", peer.DTYPES), ["fp8_e4m3", "bf16"])
        # the default stays gemmbridge bench's
        self.assertEqual(peer.parse_args([]).dtypes, "f32,tf32,f16,bf16")

    def test_scalings(self):
        self.assertEqual(peer.parse_args([]).scalings, "tensorwise,rowwise,block")
        self.assertEqual(peer.SCALINGS, ["tensorwise", "rowwise", "block", "block_1x128", "block_128x128_1x128"])
        self.assertEqual(peer.split_list("--scalings", " rowwise, block,rowwise ", peer.SCALINGS), ["rowwise", "block"])
        with self.assertRaises(peer.UsageError) as cm:
            peer.split_list("--scalings", "rowwise,columnwise", peer.SCALINGS)
        self.assertIn("unknown scaling 'columnwise'", str(cm.exception))
        self.assertEqual(peer.RECIPES["block"], ("1x128", "128x128"))
        self.assertEqual(peer.RECIPES["block_128x128_1x128"], ("128x128", "1x128"))

    def test_fp8_shape_rule(self):
        self.assertTrue(peer.fp8_shape_ok(16, 16, 16))
        self.assertTrue(peer.fp8_shape_ok(5120, 2048, 768))
        for shape in ((1, 4096, 4096), (3537, 12288, 2048), (4096, 4095, 4096), (4096, 4096, 2047),
                      (8, 64, 64), (64, 64, 8), (0, 16, 16)):
            self.assertFalse(peer.fp8_shape_ok(*shape), shape)
        # which suite shapes get fp8_e4m3 rows
        self.assertEqual([s for s in peer.SUITES["small"] if peer.fp8_shape_ok(*s)],
                         [(16, 4096, 4096), (128, 4096, 4096), (64, 64, 64), (256, 256, 256)])
        self.assertEqual([s for s in peer.SUITES["misaligned"] if peer.fp8_shape_ok(*s)], [])
        self.assertEqual(len([s for s in peer.SUITES["llm"] if peer.fp8_shape_ok(*s)]), 5)

    def test_scale_layouts(self):
        L = peer.scale_layout
        # x in 1x128 blocks: [m, ceil(k/128)], strides (1, m)
        self.assertEqual(L(("block", "x"), 256, 384), ((256, 3), (1, 256), 768))
        self.assertEqual(L(("block", "x"), 48, 400), ((48, 4), (1, 48), 192))
        # w in 128x128 blocks, as scale_b (for wq.t()): [kb, nb] strides (1, round4(kb)), the
        # k-blocks of each n-block padded to 4
        self.assertEqual(L(("block", "w"), 512, 384), ((3, 4), (1, 4), 16))
        self.assertEqual(L(("block", "w"), 512, 512), ((4, 4), (1, 4), 16))
        self.assertEqual(L(("block", "w"), 640, 1152), ((9, 5), (1, 12), 60))
        # w in 1x128 blocks, as scale_b: the transpose of [n, kb] strides (1, n)
        self.assertEqual(L(("block_1x128", "w"), 512, 384), ((3, 512), (512, 1), 1536))
        self.assertEqual(L(("block_1x128", "x"), 256, 384), ((256, 3), (1, 256), 768))
        # x in 128x128 blocks, as scale_a: [mb, kb] strides (round4(kb), 1)
        self.assertEqual(L(("block_128x128_1x128", "x"), 256, 384), ((2, 3), (4, 1), 8))
        self.assertEqual(L(("block_128x128_1x128", "w"), 512, 384), ((3, 512), (512, 1), 1536))
        # tensorwise and rowwise
        self.assertEqual(L(("tensorwise", "x"), 256, 384), ((), (), 1))
        self.assertEqual(L(("tensorwise", "w"), 512, 384), ((), (), 1))
        self.assertEqual(L(("rowwise", "x"), 256, 384), ((256, 1), (1, 1), 256))
        self.assertEqual(L(("rowwise", "w"), 512, 384), ((1, 512), (512, 1), 512))
        # every layout's elements fit its storage, none overlapping
        for recipe in peer.SCALINGS:
            for side, rows in (("x", 272), ("w", 400)):
                shape, strides, storage = L((recipe, side), rows, 1040)
                offsets = {0}
                for size, stride in zip(shape, strides):
                    offsets = {o + i * stride for o in offsets for i in range(size)}
                self.assertLess(max(offsets), storage, (recipe, side))
                n = 1
                for size in shape:
                    n *= size
                self.assertEqual(len(offsets), n, (recipe, side))

    def test_accuracy_input_errors_exit_2(self):
        with tempfile.TemporaryDirectory() as d:
            missing = os.path.join(d, "nowhere")
            rc, out, err = run_peer("--accuracy", missing)
            self.assertEqual((rc, out), (2, ""), err)
            self.assertIn("no such directory", err)
            rc, _, err = run_peer("--accuracy", d)  # no meta.json
            self.assertEqual(rc, 2, err)
            self.assertIn("meta.json", err)
            with open(os.path.join(d, "meta.json"), "w") as f:
                f.write("{not json")
            rc, _, err = run_peer("--accuracy", d)
            self.assertEqual(rc, 2, err)
            self.assertIn("meta.json is not valid JSON", err)
            for meta, msg in (({"m": 16, "n": 16, "recipes": ["block"]}, "'k' must be a positive integer"),
                              ({"m": 16, "n": 16, "k": 0, "recipes": ["block"]}, "'k' must be a positive integer"),
                              ({"m": 16, "n": 16, "k": 16, "recipes": []}, "'recipes' must be"),
                              ({"m": 16, "n": 16, "k": 16, "recipes": ["colwise"]}, "unknown recipe 'colwise'")):
                with open(os.path.join(d, "meta.json"), "w") as f:
                    json.dump(meta, f)
                rc, out, err = run_peer("--accuracy", d)
                self.assertEqual((rc, out), (2, ""), (meta, err))
                self.assertIn(msg, err, meta)
        recipes = ["tensorwise", "block"]
        for skip, sizes, name, msg in (
            (("x.f32",), None, "x.f32", "is missing: expected 1024 bytes ([16, 16] float32)"),
            (("ours_block.f32",), None, "ours_block.f32", "is missing: expected 2048 bytes ([16, 32] float32)"),
            ((), {"w.f32": 2044}, "w.f32", "has 2044 bytes, expected 2048 ([32, 16] float32)"),
        ):
            with tempfile.TemporaryDirectory() as d:
                write_accuracy_dir(d, 16, 32, 16, recipes, skip=skip, sizes=sizes)
                rc, out, err = run_peer("--accuracy", d)
                self.assertEqual((rc, out), (2, ""), err)
                self.assertIn(os.path.join(d, name), err)
                self.assertIn(msg, err)

    def test_accuracy_excludes_list(self):
        rc, out, err = run_peer("--list", "--accuracy", "somewhere")
        self.assertEqual((rc, out), (2, ""))
        self.assertIn("not allowed with", err)

    def test_leading_dims(self):
        self.assertEqual(peer.leading_dims("matmul", 4096, 4095, 4096), {"x": 4096, "w": 4095, "out": 4095})
        self.assertEqual(peer.leading_dims("linear", 4096, 4096, 2047), {"x": 2047, "w": 2047, "out": 4096})

    def test_list(self):
        rc, out, _ = run_peer("--list")
        self.assertEqual(rc, 0)
        for name in peer.SUITE_ORDER:
            self.assertIn(f"{name} (", out)
        self.assertIn("m=8192   n=8192   k=8191", out)

    def test_usage_errors_exit_2(self):
        for args, msg in (
            (["--suite", "huge"], "unknown suite 'huge'"),
            (["--dtypes", "f16,f64"], "unknown dtype 'f64'"),
            (["--ops", "matmul,conv"], "unknown op 'conv'"),
            (["--dtypes", ","], "no dtypes to run"),
            (["--dtypes", "fp8_e4m3,fp8_e5m2"], "unknown dtype 'fp8_e5m2'"),
            (["--dtypes", "fp8_e4m3", "--scalings", "columnwise"], "unknown scaling 'columnwise'"),
            (["--scalings", "rowwise,blockwise"], "unknown scaling 'blockwise'"),
            (["--scalings", " , "], "no scalings to run"),
            (["--reps", "0"], "--reps 0"),
            (["--gap-ms", "-1"], "--gap-ms -1.0"),
            (["--gap-ms", "nan"], "--gap-ms nan"),
            (["--device", "tpu"], "invalid choice"),
        ):
            rc, out, err = run_peer(*args)
            self.assertEqual(rc, 2, (args, err))
            self.assertIn(msg, err, args)
            self.assertEqual(out, "", args)

    def test_split_list(self):
        self.assertEqual(peer.split_list("--dtypes", " bf16, f16,bf16 ", peer.DTYPES), ["bf16", "f16"])


class NormPeer(unittest.TestCase):
    """bench/norm_peer.py without a GPU: its byte counts are gemmbridge's, its usage errors exit 2."""

    def test_bytes_match_gemmbridge(self):
        # crates/gemmbridge/src/norm/tests.rs, layouts_and_byte_counts: 3 rows x 4 features, bf16
        self.assertEqual(norm_peer.bytes_moved(3, 4, 2, "rmsnorm"), 56)
        self.assertEqual(norm_peer.bytes_moved(3, 4, 2, "rmsnorm_fwd_bwd"), 68 + 100)

    def test_usage_errors_exit_2(self):
        for args, msg in (
            (["--rows", "0"], "--rows '0'"),
            (["--rows", "8k"], "--rows '8k'"),
            (["--ops", "layernorm"], "unknown op 'layernorm'"),
            (["--dtypes", "f32"], "unknown dtype 'f32'"),
            (["--gap-ms", "-1"], "--gap-ms -1.0"),
        ):
            p = subprocess.run([sys.executable, NORM_PEER, *args], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(msg, p.stderr, args)
            self.assertEqual(p.stdout, "", args)


class DecodePeer(unittest.TestCase):
    """bench/decode_peer.py without a GPU: its byte counts are gemmbridge's, its labels match
    ours, its usage errors exit 2."""

    def test_bytes_and_labels_match_gemmbridge(self):
        # crates/gemmbridge-cli/src/bench/decode.rs, the_bytes_are_the_held_keys_and_values_q_and_o
        s = dict(name="x", b=2, h_q=4, h_kv=2, d=8, s_kv=64, page_size=16, lens=[10, 30])
        self.assertEqual(decode_peer.bytes_moved(s, 2), (1280 + 128) * 2)
        self.assertEqual(decode_peer.lens(dict(s, lens=None)), [64, 64])
        self.assertEqual([decode_peer.layout(s, b) for b in decode_peer.BACKENDS], ["x", "x+flash", "x+efficient"])
        self.assertEqual([s["b"] for s in decode_peer.SHAPES], [1, 8, 64, 64])

    def test_usage_errors_exit_2(self):
        for args, msg in (
            (["--dtypes", "f32"], "unknown dtype 'f32'"),
            (["--backends", "math"], "unknown backend 'math'"),
            (["--shapes", "nope"], "unknown shape 'nope'"),
        ):
            p = subprocess.run([sys.executable, DECODE_PEER, *args], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(msg, p.stderr, args)
            self.assertEqual(p.stdout, "", args)


class DecodeStepPeer(unittest.TestCase):
    """bench/decode_step_peer.py without a GPU: its byte count is gemmbridge's, its labels and
    shapes match ours, its usage errors exit 2."""

    def test_bytes_labels_and_shapes_match_gemmbridge(self):
        # crates/gemmbridge-cli/src/bench/decode_step.rs, every_shape_of_one_length_is_a_step_at_4096_keys
        # and crates/gemmbridge/src/layer/decode_tests.rs, the_bytes_are_the_weights_and_the_held_keys_and_values
        weights = 2 * ((6144 + 4096 + 28672 + 14336) * 4096 + 8192)
        self.assertEqual(decode_step_peer.weight_bytes(), weights)
        s = [s for s in decode_step_peer.SHAPES if s["b"] == 64][0]
        self.assertEqual(decode_step_peer.bytes_moved(s), weights + 2 * 64 * 4096 * 1024 * 2)
        self.assertEqual([s["b"] for s in decode_step_peer.SHAPES], [1, 8, 64])
        self.assertEqual({s["s_kv"] for s in decode_step_peer.SHAPES}, {4096})
        self.assertEqual([decode_step_peer.layout(w) for w in decode_step_peer.WAYS],
                         ["llama3-8b-p16", "llama3-8b-p16+compile"])
        rec = decode_step_peer.record(s, "eager", (2.0, 1.9, None))
        self.assertEqual({k: rec[k] for k in ("op", "dtype", "m", "n", "k", "batch", "layout")},
                         dict(op="decode_step", dtype="bf16", m=1, n=4096, k=4096, batch=64, layout="llama3-8b-p16"))
        self.assertAlmostEqual(rec["tbps"], decode_step_peer.bytes_moved(s) / 2e-3 / 1e12)
        self.assertEqual(decode_step_peer.record(s, "compile", (None, None, "E: x"))["error"], "E: x")

    def test_usage_errors_exit_2(self):
        for args, msg in (
            (["--ways", "jit"], "unknown way 'jit'"),
            (["--batch-sizes", "2"], "unknown batch-size '2'"),
            (["--reps", "0"], "--reps needs at least 1"),
        ):
            p = subprocess.run([sys.executable, DECODE_STEP_PEER, *args], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(msg, p.stderr, args)
            self.assertEqual(p.stdout, "", args)


class MoePeer(unittest.TestCase):
    """bench/moe_peer.py without a GPU: its layers and FLOP count are gemmbridge's, its usage
    errors exit 2."""

    def test_layers_and_flops_match_gemmbridge(self):
        # crates/gemmbridge-cli/src/bench/moe.rs, the_layers_are_qwen3s_and_mixtrals
        self.assertEqual([s["name"] for s in moe_peer.SHAPES], ["qwen3-30b-a3b", "mixtral-8x7b"])
        q = moe_peer.SHAPES[0]
        self.assertAlmostEqual(moe_peer.forward_flops(q) / 1e9, 311.4, delta=0.1)
        self.assertEqual(moe_peer.forward_flops(q), 6 * 32768 * 2048 * 768 + 2 * 4096 * 2048 * 128)

    def test_usage_errors_exit_2(self):
        for args, msg in (
            (["--ways", "jit"], "unknown way 'jit'"),
            (["--ops", "moe"], "unknown op 'moe'"),
            (["--shapes", "llama"], "unknown shape 'llama'"),
        ):
            p = subprocess.run([sys.executable, MOE_PEER, *args], capture_output=True, text=True)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(msg, p.stderr, args)
            self.assertEqual(p.stdout, "", args)


@unittest.skipUnless(HAVE_TORCH, "PyTorch not installed")
class CpuDryRun(unittest.TestCase):
    def test_rows(self):
        shapes = [(64, 64, 64), (33, 255, 127), (16, 128, 256)]
        saved = peer.SUITES.get("small")
        peer.SUITES["small"] = shapes
        try:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "p.jsonl")
                err = io.StringIO()
                old = sys.stderr
                sys.stderr = err
                try:
                    rc = peer.main(["--suite", "small", "--device", "cpu", "--reps", "1", "--out", path])
                finally:
                    sys.stderr = old
                self.assertEqual(rc, 0, err.getvalue())
                with open(path) as f:
                    rows = [json.loads(line) for line in f]
        finally:
            peer.SUITES["small"] = saved
        env, rest = rows[0], rows[1:]
        self.assertEqual(env["op"], "env")
        self.assertEqual(env["device"], "cpu")
        self.assertNotIn("median_ms", env)
        ops = [o for o in peer.DEFAULT_OPS if o != "launch"]
        want = [(d, s, o) for d in peer.DEFAULT_DTYPES for s in shapes for o in ops if peer.op_applies(o, d)]
        self.assertEqual([(r["dtype"], (r["m"], r["n"], r["k"]), r["op"]) for r in rest], want)
        for r in rest:
            for f, t in GEMM_FIELDS.items():
                self.assertIsInstance(r[f], t, (f, r))
            self.assertGreater(r["median_ms"], 0)
            self.assertLessEqual(r["min_ms"], r["median_ms"])
            self.assertEqual(r["batch"], 1)
        self.assertFalse(any(r["op"] == "launch" for r in rows))

    def test_gap_is_idle_time_before_each_row_and_recorded(self):
        calls = []
        t0 = time.perf_counter()
        peer.time_fn(lambda: calls.append(time.perf_counter()), peer.Clock("cpu"), 1, warmup=1, gap_ms=60)
        self.assertGreaterEqual(calls[0] - t0, 0.06)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "p.jsonl")
            rc = peer.main(["--suite", "small", "--device", "cpu", "--reps", "1", "--ops", "matmul",
                            "--dtypes", "f32", "--gap-ms", "5", "--out", path])
            peer.GAP_MS = 0.0
            self.assertEqual(rc, 0)
            with open(path) as f:
                env = json.loads(f.readline())
        self.assertEqual(env["gap_ms"], 5.0)

    def test_layout_check_catches_padding(self):
        peer.torch = torch
        x = torch.zeros(4, 7)
        w = torch.zeros(7, 5)
        peer.check_layout("matmul", 4, 5, 7, x, w, x @ w)
        padded = torch.zeros(4, 8)[:, :7]
        with self.assertRaises(RuntimeError):
            peer.check_layout("matmul", 4, 5, 7, padded, w, padded @ w)

    def test_rotation_shapes(self):
        peer.torch = torch
        xs, ws = peer.rotation(33, 255, 127, "bf16", "linear", "cpu")
        self.assertEqual(len(xs), 8)
        self.assertEqual((xs[0].shape, xs[0].stride(), xs[0].dtype), ((33, 127), (127, 1), torch.bfloat16))
        self.assertEqual((ws[0].shape, ws[0].stride()), ((255, 127), (127, 1)))
        xs, ws = peer.rotation(33, 255, 127, "f32", "matmul", "cpu")
        self.assertEqual((ws[0].shape, ws[0].stride()), ((127, 255), (255, 1)))

    def test_fp8_skipped_on_cpu(self):
        rc, rows, err = run_main(["--suite", "small", "--dtypes", "fp8_e4m3,bf16", "--ops", "matmul",
                                  "--device", "cpu", "--reps", "1"], [(64, 64, 64)])
        self.assertEqual(rc, 0, err)
        self.assertIn("fp8_e4m3 rows need torch._scaled_mm on a CUDA GPU", err)
        self.assertEqual([(r["op"], r.get("dtype")) for r in rows], [("env", None), ("matmul", "bf16")])


def dequantised(q, scale, recipe_side):
    rows, k = q.shape
    return q.float() * peer.operand_scales(scale, recipe_side, rows, k)


def check_quantize(test, t, recipe_side):
    """quantize(t, recipe_side): E4M3 [rows, k] contiguous, the scale in scale_layout()'s
    layout, each group's largest magnitude mapped to 448, and every element within E4M3's
    rounding (1/16 relative; subnormals: half their step, 2^-10 of the scale)."""
    rows, k = t.shape
    q, scale = peer.quantize(t, recipe_side)
    test.assertEqual((q.dtype, tuple(q.shape), q.stride()), (torch.float8_e4m3fn, (rows, k), (k, 1)))
    shape, strides, _ = peer.scale_layout(recipe_side, rows, k)
    test.assertEqual((scale.dtype, tuple(scale.shape), scale.stride()), (torch.float32, shape, strides), recipe_side)
    test.assertEqual(scale.device, t.device)
    per = peer.operand_scales(scale, recipe_side, rows, k)
    got = q.float() * per
    bound = (t.abs() / 16 + per * 2.0 ** -10) * (1 + 1e-6)
    worst = ((got - t).abs() - bound).max().item()
    test.assertLessEqual(worst, 0.0, recipe_side)
    test.assertEqual(q.float().abs().max().item(), 448.0, recipe_side)
    return q, scale


@unittest.skipUnless(HAVE_TORCH, "PyTorch not installed")
class Quantize(unittest.TestCase):
    def setUp(self):
        peer.torch = torch
        g = torch.Generator().manual_seed(7)
        # rows of different magnitudes, k not a multiple of 128, rows not a multiple of 128
        self.x = torch.randn(200, 300, generator=g) * (2.0 ** (torch.arange(200) % 9 - 4))[:, None]
        self.w = torch.randn(144, 300, generator=g)

    def test_each_recipe(self):
        for recipe in peer.SCALINGS:
            check_quantize(self, self.x, (recipe, "x"))
            check_quantize(self, self.w, (recipe, "w"))

    def test_scales(self):
        x = self.x
        f = lambda t: (t.abs().max() / 448.0).item()  # noqa: E731  (in float32, as quantize)
        _, s = peer.quantize(x, ("tensorwise", "x"))
        self.assertEqual(s.item(), f(x))
        _, s = peer.quantize(x, ("rowwise", "x"))
        self.assertTrue(torch.equal(s[:, 0], x.abs().amax(dim=1) / 448.0))
        _, s = peer.quantize(self.w, ("rowwise", "w"))
        self.assertTrue(s.is_contiguous())
        self.assertTrue(torch.equal(s[0], self.w.abs().amax(dim=1) / 448.0))
        _, s = peer.quantize(x, ("block", "x"))  # 1x128: [200, 3]
        self.assertEqual(s[5, 2].item(), f(x[5, 256:]))
        _, s = peer.quantize(self.w, ("block", "w"))  # 128x128 as scale_b: [kb=3, nb=2]
        self.assertEqual(s[1, 1].item(), f(self.w[128:, 128:256]))
        # the padding of each n-block's k-blocks (to 4) is zero
        self.assertEqual(torch.as_strided(s, (2, 4), (4, 1))[:, 3].tolist(), [0.0, 0.0])
        _, s = peer.quantize(x, ("block_128x128_1x128", "x"))  # 128x128 as scale_a: [mb=2, kb=3]
        self.assertEqual(s[1, 0].item(), f(x[128:, :128]))
        _, s = peer.quantize(self.w, ("block_1x128", "w"))  # 1x128 as scale_b: [kb=3, n]
        self.assertEqual(s[2, 7].item(), f(self.w[7, 256:]))

    def test_zero_groups_scale_1(self):
        t = torch.randn(256, 256)
        t[:128, :128] = 0
        for recipe, side, where in (("block", "x", (0, 0)), ("block", "w", (0, 0)),
                                    ("block_128x128_1x128", "x", (0, 0))):
            q, s = peer.quantize(t, (recipe, side))
            self.assertEqual(s[where].item(), 1.0, (recipe, side))
            self.assertEqual(q[:128, :128].float().abs().max().item(), 0.0)
        q, s = peer.quantize(torch.zeros(32, 16), ("tensorwise", "x"))
        self.assertEqual(s.item(), 1.0)
        q, s = peer.quantize(torch.zeros(32, 16), ("rowwise", "w"))
        self.assertEqual(s.tolist(), [[1.0] * 32])

    def test_saturates_not_overflows(self):
        # a value rounding above 448 after the division stays finite
        t = torch.tensor([[448.0, -448.0] + [1e-3] * 14] * 16)
        q, _ = peer.quantize(t, ("tensorwise", "x"))
        self.assertTrue(torch.isfinite(q.float()).all())

    def test_accuracy_cpu(self):
        m, n, k = 16, 32, 48
        recipes = ["tensorwise", "rowwise", "block", "block_1x128", "block_128x128_1x128"]
        exact = lambda x, w: product(x, w, m, n, k)  # noqa: E731
        with tempfile.TemporaryDirectory() as d:
            write_accuracy_dir(d, m, n, k, recipes, ours=exact)
            out = os.path.join(d, "acc.jsonl")
            err = io.StringIO()
            old = sys.stderr
            sys.stderr = err
            try:
                rc = peer.main(["--accuracy", d, "--device", "cpu", "--out", out])
            finally:
                sys.stderr = old
            self.assertEqual(rc, 0, err.getvalue())
            with open(out) as f:
                rows = [json.loads(line) for line in f]
        self.assertEqual([r["scaling"] for r in rows], recipes)
        for r in rows:
            self.assertEqual((r["op"], r["m"], r["n"], r["k"]), ("fp8_accuracy", m, n, k))
            self.assertEqual(r["ours_rel_err"], 0.0)  # the exact product
            if "torch_error" in r:
                self.assertNotIn("torch_rel_err", r)
            else:
                self.assertLess(r["torch_rel_err"], 0.1)
                self.assertEqual(r["ratio"], 0.0)


@unittest.skipUnless(have_fp8_gpu(), "no CUDA GPU with FP8 (compute capability 8.9+)")
class Fp8Gpu(unittest.TestCase):
    def setUp(self):
        peer.torch = torch

    def test_scaled_mm_every_recipe(self):
        """_scaled_mm takes every recipe's scales and computes the product of the dequantised
        operands. k = 384: 3 k-blocks, padded to 4 in the 128x128 layouts; k = 1152: 9, to
        12. Some PyTorch versions (2.11) refuse padded 128x128 scales: those are skipped, but
        wherever _scaled_mm runs, its result must be right."""
        ran = set()
        for m, n, k in ((256, 512, 384), (128, 384, 1152), (272, 144, 512), (64, 64, 64), (512, 256, 2048)):
            g = torch.Generator(device="cuda").manual_seed(1)
            x = torch.randn(m, k, device="cuda", generator=g)
            w = torch.randn(n, k, device="cuda", generator=g)
            for recipe in gpu_recipes():
                xq, sx = check_quantize(self, x, (recipe, "x"))
                wq, sw = check_quantize(self, w, (recipe, "w"))
                try:
                    y = peer.scaled_mm(xq, sx, wq, sw)
                except RuntimeError as e:
                    padded = "128x128" in peer.RECIPES[recipe] and peer.ceil_div(k, 128) % 4
                    self.assertTrue(padded and "Invalid scaling configuration" in str(e), (recipe, m, n, k, e))
                    continue
                self.assertEqual((y.dtype, tuple(y.shape)), (torch.bfloat16, (m, n)))
                want = dequantised(xq, sx, (recipe, "x")).double() @ dequantised(wq, sw, (recipe, "w")).double().t()
                e = peer.rel_err(y, want)
                self.assertLess(e, 1e-2, (recipe, m, n, k, e))
                ran.add((recipe, (m, n, k)))
        # k-blocks a multiple of 4: every version takes every recipe
        for shape in ((272, 144, 512), (64, 64, 64), (512, 256, 2048)):
            self.assertEqual({r for r, s in ran if s == shape}, set(gpu_recipes()), shape)

    def test_fp8_rows(self):
        shapes = [(256, 512, 512), (100, 256, 256), (64, 64, 64)]
        rc, rows, err = run_main(["--suite", "small", "--dtypes", "fp8_e4m3", "--scalings",
                                  ",".join(gpu_recipes()), "--reps", "2"], shapes)
        self.assertEqual(rc, 0, err)
        self.assertIn("fp8_e4m3 100x256x256 skipped", err)
        rest = rows[1:]
        want = [(s, sc) for s in (shapes[0], shapes[2]) for sc in gpu_recipes()]
        self.assertEqual([((r["m"], r["n"], r["k"]), r["scaling"]) for r in rest], want)
        for r in rest:
            self.assertEqual((r["op"], r["dtype"], r["batch"]), ("scaled_mm", "fp8_e4m3", 1))
            for f, t in GEMM_FIELDS.items():
                self.assertIsInstance(r[f], t, (f, r))
            self.assertLessEqual(r["min_ms"], r["median_ms"])

    def test_fp8_refused_shape(self):
        # 3 k-blocks: PyTorch versions that refuse padded 128x128 scales give an error row
        rc, rows, err = run_main(["--suite", "small", "--dtypes", "fp8_e4m3", "--scalings", "block,rowwise",
                                  "--reps", "2"], [(256, 512, 384)])
        rows = rows[1:]
        self.assertEqual([r["scaling"] for r in rows], ["block", "rowwise"], err)
        self.assertNotIn("error", rows[1])
        self.assertEqual(rc, 1 if "error" in rows[0] else 0, err)
        if "error" in rows[0]:
            self.assertEqual((rows[0]["op"], rows[0]["dtype"], rows[0]["m"]), ("scaled_mm", "fp8_e4m3", 256))
            self.assertNotIn("median_ms", rows[0])

    def test_accuracy_gpu(self):
        m, n, k = 32, 48, 512
        recipes = gpu_recipes()
        with tempfile.TemporaryDirectory() as d:
            write_accuracy_dir(d, m, n, k, recipes, ours=lambda x, w: product(x, w, m, n, k))
            rc, out, err = run_peer("--accuracy", d)
        self.assertEqual(rc, 0, err)
        rows = [json.loads(line) for line in out.splitlines()]
        self.assertEqual([r["scaling"] for r in rows], recipes)
        for r in rows:
            self.assertNotIn("torch_error", r)
            self.assertLess(r["torch_rel_err"], 0.1)
            self.assertGreater(r["torch_rel_err"], 0.0)
            self.assertEqual((r["ours_rel_err"], r["ratio"]), (0.0, 0.0))

    def test_accuracy_gpu_refused(self):
        # 3 k-blocks: where PyTorch refuses a recipe, its line says why and still has ours
        m, n, k = 32, 48, 384
        with tempfile.TemporaryDirectory() as d:
            write_accuracy_dir(d, m, n, k, gpu_recipes())
            rc, out, err = run_peer("--accuracy", d)
        self.assertEqual(rc, 0, err)
        for r in (json.loads(line) for line in out.splitlines()):
            self.assertEqual(r["ours_rel_err"], 1.0)  # zeros written for ours
            if "torch_error" in r:
                self.assertIn("128x128", peer.RECIPES[r["scaling"]])
                self.assertNotIn("torch_rel_err", r)
            else:
                self.assertLess(r["torch_rel_err"], 0.1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
