# Convolutions with graph replay: the conv GPU tests, memcheck over the searches/errors/replay,
# three alternated pairs beside bench/conv_peer.py (forward and fused, NHWC, batch 32; ours on
# PyTorch's own cuDNN 9.19 through a libcudnn.so link, then once on the system's 9.14), one pair of
# everything at --reps 10; then gemmbridge-burn train with burn's autotuner on (fused vs unfused bias
# gradient vs burn alone)
set -x
export CUDA_PATH=/usr/local/cuda
timeout 120 bash .gpu/run tests every_direction measured_search bad_input_is_named > /tmp/t.log 2>&1; echo "tests rc $?"
grep -E '^test result: ok. [1-9]|FAILED|panicked' /tmp/t.log | head; grep -A3 panicked /tmp/t.log | head -12
timeout 150 bash .gpu/run sanitize measured_search bad_input_is_named > /tmp/s.log 2>&1; grep -E 'ERROR SUMMARY' /tmp/s.log | sort | uniq -c
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p .gpu/payload-bin && tar -C .gpu/payload-bin --strip-components=1 -xzf .gpu/payload.tgz bin/gemmbridge
G=.gpu/payload-bin/gemmbridge; mkdir -p /tmp/c /tmp/tc
TC=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"); ln -sf $TC/libcudnn.so.9 /tmp/tc/libcudnn.so
SYS_LD=$LD_LIBRARY_PATH; export LD_LIBRARY_PATH=/tmp/tc:$TC:$LD_LIBRARY_PATH
A="--conv-layouts nhwc --conv-batches 32"
ours() { timeout 100 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused $A --out /tmp/c/ours$1.jsonl > /dev/null 2>/tmp/c/ours$1.err; echo "ours$1 rc $?"; }
peer() { timeout 100 python3 bench/conv_peer.py --ops conv_fwd,conv_bias_relu --layouts nhwc --batches 32 --out /tmp/c/peer$1.jsonl 2>/dev/null; echo "peer$1 rc $?"; }
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3
head -1 /tmp/c/ours1.jsonl
LD_LIBRARY_PATH=$SYS_LD timeout 100 $G bench --ops conv_fwd,conv_bias_relu $A --out /tmp/c/ours-sys.jsonl > /dev/null 2>&1; head -1 /tmp/c/ours-sys.jsonl
$G compare --ours /tmp/c/ours1.jsonl,/tmp/c/ours2.jsonl,/tmp/c/ours3.jsonl --peer /tmp/c/peer1.jsonl,/tmp/c/peer2.jsonl,/tmp/c/peer3.jsonl --bound 0.95 > /tmp/c/compare-fwd.txt; tail -9 /tmp/c/compare-fwd.txt
timeout 150 python3 bench/conv_peer.py --reps 10 --out /tmp/c/peer-all.jsonl 2>/dev/null; echo "peer-all rc $?"
timeout 150 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused,conv_dgrad,conv_wgrad --reps 10 --out /tmp/c/ours-all.jsonl > /dev/null 2>/tmp/c/ours-all.err; echo "ours-all rc $?"
$G compare --ours /tmp/c/ours-all.jsonl --peer /tmp/c/peer-all.jsonl --bound 0.95 > /tmp/c/compare-all.txt; grep -A80 '^dtype op' /tmp/c/compare-all.txt | awk '{print $1, $2, $3, $4, $5}' | column -t | head -50
tar -C /tmp -czf $OUT/conv.tgz c; cp /tmp/t.log $OUT/tests.log; cp /tmp/s.log $OUT/sanitize.log
export LD_LIBRARY_PATH=$SYS_LD
gunzip -c .gpu/gemmbridge-burn-autotune.gz > /tmp/gba && chmod +x /tmp/gba
timeout 330 /tmp/gba train --data crates/gemmbridge/examples/data/digits.csv.gz --batch 4096 --modes off,on-tf32,on-tf32-unfused-bgrad --out $OUT/burn_train_autotuned.jsonl > /tmp/b.log 2>&1; echo "burn rc $?"; tail -7 /tmp/b.log
