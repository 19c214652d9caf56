# Every GPU test (oracles included) at the final code of the previous session plus conv graph
# replay (306aea3 cherry-picked), memcheck over the conv tests, the FP8 and bf16 training layers
# beside bench/train_peer.py (3 alternated pairs, ours autotuned per step), one pair of the conv
# forward/fused rows with our process on PyTorch's own cuDNN (9.19, via a libcudnn.so link)
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version())"
python3 .gpu/torch_oracle.py /tmp/oracle_shared > /tmp/o1.log 2>&1
python3 bench/train_oracle.py /tmp/oracle_train > /tmp/o2.log 2>&1; tail -2 /tmp/o2.log
date +%T
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 280 bash .gpu/run tests --test-threads 1 > /tmp/t.log 2>&1; echo "tests rc $?"
date +%T
grep -E '^test result|FAILED|panicked' /tmp/t.log | grep -v 'ok. 0 passed' | head -40
grep -A4 'panicked' /tmp/t.log | head -30
cp /tmp/t.log $OUT/tests.log
timeout 90 bash .gpu/run sanitize conv > /tmp/s1.log 2>&1; grep -E 'ERROR SUMMARY|test result: [A-Z]' /tmp/s1.log | sort | uniq -c; rm -f $OUT/sanitize.log; cp /tmp/s1.log $OUT/sanitize.log
date +%T
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p .gpu/payload-bin && tar -C .gpu/payload-bin --strip-components=1 -xzf .gpu/payload.tgz bin/gemmbridge
G=.gpu/payload-bin/gemmbridge; mkdir -p /tmp/p /tmp/c
ours() { timeout 100 $G train-bench --dtypes fp8,bf16 --tune --out /tmp/p/ours$1.jsonl 2>&1 | grep -v "^$" | tail -14; }
peer() { timeout 100 python3 bench/train_peer.py --dtypes fp8,bf16 --out /tmp/p/peer$1.jsonl 2>&1 | grep -v -i warn | tail -3; }
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3
$G compare --ours /tmp/p/ours1.jsonl,/tmp/p/ours2.jsonl,/tmp/p/ours3.jsonl --peer /tmp/p/peer1.jsonl,/tmp/p/peer2.jsonl,/tmp/p/peer3.jsonl --bound 1.0 > /tmp/p/compare.txt 2>&1; tail -24 /tmp/p/compare.txt
date +%T
TC=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"); mkdir -p /tmp/tc; ln -sf $TC/libcudnn.so.9 /tmp/tc/libcudnn.so
A="--conv-layouts nhwc --conv-batches 32"
timeout 100 python3 bench/conv_peer.py --ops conv_fwd,conv_bias_relu --layouts nhwc --batches 32 --out /tmp/c/peer1.jsonl 2>/dev/null; echo "peer rc $?"
LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH timeout 100 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused $A --out /tmp/c/ours1.jsonl > /dev/null 2>/tmp/c/ours1.err; echo "ours rc $?"
$G compare --ours /tmp/c/ours1.jsonl --peer /tmp/c/peer1.jsonl --bound 0.95 > /tmp/c/compare-fwd.txt; tail -14 /tmp/c/compare-fwd.txt; grep -o '"cudnn":[0-9]*' /tmp/c/ours1.jsonl | head -1
date +%T
tar -C /tmp -czf $OUT/rows.tgz p c
