#!/usr/bin/env bash
# Device call 29: every GPU test at the final library code (after the second review), and the
# tiny-problem tuning with the search's budget passed on between algorithm ids.
set -x
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
B="bash .gpu/run bin gemmbridge"
timeout 170 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
timeout 60 $B tune --suite small --dtypes f32 --ops matmul,linear --db $R/tactics-tiny.json > $R/tune-tiny.txt 2>&1; echo "tune rc $?" >> $R/tune-tiny.txt
tar czf $OUT/call29.tgz -C $OUT r
