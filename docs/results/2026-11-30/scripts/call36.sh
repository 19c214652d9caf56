#!/usr/bin/env bash
# Device call 36: every GPU test after the capture tests were given one fixture (gelu_bias_call).
export OUT=/tmp/o; rm -rf $OUT; mkdir -p $OUT; R=$OUT/r; mkdir -p $R
timeout 200 bash .gpu/run tests > $R/tests.txt 2>&1; echo "tests rc $?" >> $R/tests.txt
tar czf $OUT/call36.tgz -C $OUT r
