#!/usr/bin/env python3
"""Checks of bench/peer.py that need no GPU: `python3 bench/test_peer.py`.

Without PyTorch: the suites against crates/gemmbridge/src/suites.rs, the op/dtype rules,
the rotation count, --list, and the usage errors (exit 2). With PyTorch installed (any
build), also a `--device cpu --reps 1` run on small shapes, including misaligned ones: the
rows' fields and types, the operands' strides, and the env row.
"""

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")
RUST_SUITES = os.path.join(HERE, "..", "crates", "gemmbridge", "src", "suites.rs")

spec = importlib.util.spec_from_file_location("peer", PEER)
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

GEMM_FIELDS = {"op": str, "dtype": str, "m": int, "n": int, "k": int, "batch": int,
               "median_ms": float, "min_ms": float, "tflops": float}


def run_peer(*args):
    p = subprocess.run([sys.executable, PEER, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


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
    @unittest.skipUnless(os.path.exists(RUST_SUITES), "crates/gemmbridge/src/suites.rs not found")
    def test_suites_match_gemmbridge(self):
        for name in ("square", "llm", "small"):
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
            self.assertEqual([o for o in peer.OPS if peer.op_applies(o, d)], ["matmul", "linear"])

    def test_rotation_count(self):
        self.assertEqual(peer.rotation_count(64, 64, 64, 2), 8)
        self.assertEqual(peer.rotation_count(8192, 8192, 8192, 4), 1)  # 512 MiB exactly
        self.assertEqual(peer.rotation_count(4096, 28672, 4096, 2), 2)

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
            (["--dtypes", "fp8_e4m3"], "no dtypes to run"),
            (["--reps", "0"], "--reps 0"),
            (["--device", "tpu"], "invalid choice"),
        ):
            rc, out, err = run_peer(*args)
            self.assertEqual(rc, 2, (args, err))
            self.assertIn(msg, err, args)
            self.assertEqual(out, "", args)

    def test_split_list(self):
        self.assertEqual(peer.split_list("--dtypes", " bf16, f16,bf16 ", peer.DTYPES), ["bf16", "f16"])


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
        want = [(d, s, o) for d in peer.DTYPES for s in shapes for o in peer.OPS if peer.op_applies(o, d)]
        self.assertEqual([(r["dtype"], (r["m"], r["n"], r["k"]), r["op"]) for r in rest], want)
        for r in rest:
            for f, t in GEMM_FIELDS.items():
                self.assertIsInstance(r[f], t, (f, r))
            self.assertGreater(r["median_ms"], 0)
            self.assertLessEqual(r["min_ms"], r["median_ms"])
            self.assertEqual(r["batch"], 1)
        self.assertFalse(any(r["op"] == "launch" for r in rows))

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
