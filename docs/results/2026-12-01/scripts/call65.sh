# cuDNN convolutions and the FP8 layers' fix: every GPU test (oracles included), memcheck over the
# FP8 layer test and the conv searches/errors, probe, then conv rows beside bench/conv_peer.py:
# three alternated pairs (peer, ours, ours, peer, peer, ours) of the forward and fused forward,
# NHWC, batch 32, every dtype; then one pair of everything (both layouts, batch 32 and 1, all ops)
set -x
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv
python3 -c "import torch; print(torch.backends.cudnn.version())"; ls /usr/lib/x86_64-linux-gnu/libcudnn.so* 2>/dev/null | head -3
python3 .gpu/torch_oracle.py /tmp/oracle_shared > /tmp/o1.log 2>&1
python3 bench/train_oracle.py /tmp/oracle_train > /tmp/o2.log 2>&1
GEMMBRIDGE_TORCH_ORACLE=/tmp/oracle_shared GEMMBRIDGE_TRAIN_ORACLE=/tmp/oracle_train timeout 300 bash .gpu/run tests --test-threads 1 > /tmp/t.log 2>&1; echo "tests rc $?"
grep -E '^test result|FAILED|panicked' /tmp/t.log | grep -v 'ok. 0 passed' | head -40
grep -A3 'panicked' /tmp/t.log | head -30
timeout 200 bash .gpu/run sanitize fp8_mlps > /tmp/s1.log 2>&1; grep -E 'ERROR SUMMARY' /tmp/s1.log | sort | uniq -c; rm -f $OUT/sanitize.log
timeout 200 bash .gpu/run sanitize measured_search bad_input_is_named > /tmp/s2.log 2>&1; grep -E 'ERROR SUMMARY|test result: [A-Z]' /tmp/s2.log | sort | uniq -c
timeout 120 bash .gpu/run bin gemmbridge probe > /tmp/probe.log 2>&1; tail -8 /tmp/probe.log
CUDA_PATH=/usr/local/cuda timeout 120 bash .gpu/run bin gemmbridge-burn train --data crates/gemmbridge/examples/data/digits.csv.gz --batch 4096 --modes off,on-tf32,on-tf32-unfused-bgrad,on-tf32,on-tf32-unfused-bgrad --out $OUT/burn_train.jsonl 2>&1 | tail -9
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p .gpu/payload-bin && tar -C .gpu/payload-bin --strip-components=1 -xzf .gpu/payload.tgz bin/gemmbridge
G=.gpu/payload-bin/gemmbridge; mkdir -p /tmp/c
# PyTorch loads its own cuDNN (9.19); the system one on the loader path is 9.14: the pairs run ours on PyTorch's
TC=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"); ls $TC | head -3
SYS_LD=$LD_LIBRARY_PATH; export LD_LIBRARY_PATH=$TC:$LD_LIBRARY_PATH
A="--conv-layouts nhwc --conv-batches 32"
ours() { timeout 150 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused $A --out /tmp/c/ours$1.jsonl > /dev/null 2>/tmp/c/ours$1.err; echo "ours$1 rc $?"; }
peer() { timeout 150 python3 bench/conv_peer.py --ops conv_fwd,conv_bias_relu --layouts nhwc --batches 32 --out /tmp/c/peer$1.jsonl 2>/dev/null; echo "peer$1 rc $?"; }
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3
LD_LIBRARY_PATH=$SYS_LD timeout 150 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused $A --out /tmp/c/ours-sys.jsonl > /dev/null 2>/tmp/c/ours-sys.err; echo "ours-sys rc $?"
$G compare --ours /tmp/c/ours1.jsonl,/tmp/c/ours2.jsonl,/tmp/c/ours3.jsonl --peer /tmp/c/peer1.jsonl,/tmp/c/peer2.jsonl,/tmp/c/peer3.jsonl --bound 0.95 > /tmp/c/compare-fwd.txt; tail -12 /tmp/c/compare-fwd.txt
timeout 240 python3 bench/conv_peer.py --reps 10 --out /tmp/c/peer-all.jsonl 2>/dev/null; echo "peer-all rc $?"
timeout 240 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused,conv_dgrad,conv_wgrad --reps 10 --out /tmp/c/ours-all.jsonl > /dev/null 2>/tmp/c/ours-all.err; echo "ours-all rc $?"
$G compare --ours /tmp/c/ours-all.jsonl --peer /tmp/c/peer-all.jsonl --bound 0.95 > /tmp/c/compare-all.txt; tail -42 /tmp/c/compare-all.txt
tar -C /tmp -czf $OUT/conv.tgz c; cp /tmp/t.log $OUT/tests.log; cp /tmp/probe.log $OUT/probe.log; cat /tmp/s1.log /tmp/s2.log > $OUT/sanitize.log
