#!/usr/bin/env bash
# Device call 49: the FP8 GPU tests, memcheck over them, the probe (FP8 table), the
# quantisation kernels' bandwidth, gemmbridge's FP8 accuracy files, and FP8 tuning of the
# square and llm suites into the repository's tactic database.
set -x
export OUT=${OUT:-/tmp/o}; R=$OUT/r; mkdir -p $R
G=".gpu/run bin gemmbridge"
timeout 90 bash .gpu/run tests --nocapture --test-threads 1 > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
timeout 150 bash .gpu/run sanitize > $R/sanitize.txt 2>&1; echo "sanitize rc $?" >> $R/sanitize.txt
timeout 60 bash $G probe > $R/probe.txt 2>&1; echo "probe rc $?" >> $R/probe.txt
timeout 60 bash $G fp8 quantize > $R/quantize.txt 2>&1; echo "quantize rc $?" >> $R/quantize.txt
timeout 40 bash $G fp8 accuracy --dir /tmp/acc --seed 49 > $R/accuracy.txt 2>&1; echo "accuracy rc $?" >> $R/accuracy.txt
cp tactics/h200.json $R/h200.json
timeout 80 bash $G tune --suite square --dtypes fp8_e4m3 --db $R/h200.json > $R/tune_square.txt 2>&1; echo "tune rc $?" >> $R/tune_square.txt
timeout 100 bash $G tune --suite llm --dtypes fp8_e4m3 --db $R/h200.json > $R/tune_llm.txt 2>&1; echo "tune rc $?" >> $R/tune_llm.txt
tar czf $OUT/call49.tgz -C $OUT r
