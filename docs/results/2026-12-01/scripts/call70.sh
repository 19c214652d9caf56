# the final code: the conv GPU tests (the review's workspace and first-launch fixes) and memcheck
# over the capture test, then every GPU test of the workspace with both oracles
set -x
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
TC=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"); mkdir -p /tmp/tc; ln -sf $TC/libcudnn.so.9 /tmp/tc/libcudnn.so
date +%T
LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH timeout 60 bash .gpu/run tests legacy_api every_direction measured_search element_aligned bad_input prewarmed > /tmp/c.log 2>&1; echo "conv tests rc $?"
grep -E '^test result|panicked' /tmp/c.log | grep -v 'ok. 0 passed'; grep -A3 panicked /tmp/c.log | head; cp /tmp/c.log $OUT/conv-tests.log
LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH timeout 40 bash .gpu/run sanitize prewarmed > /tmp/s.log 2>&1; grep -E 'ERROR SUMMARY' /tmp/s.log | sort | uniq -c; rm -f $OUT/sanitize.log; cp /tmp/s.log $OUT/sanitize.log
date +%T
python3 .gpu/torch_oracle.py /tmp/oracle_shared > /tmp/o1.log 2>&1
python3 bench/train_oracle.py /tmp/oracle_train > /tmp/o2.log 2>&1
date +%T
rm -f $OUT/tests.log
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 170 bash .gpu/run tests --test-threads 1 > /tmp/t.log 2>&1; echo "tests rc $?"
grep -E '^test result|panicked' /tmp/t.log | grep -v 'ok. 0 passed'; grep -A3 panicked /tmp/t.log | head -20
cp /tmp/t.log $OUT/tests.log
date +%T
