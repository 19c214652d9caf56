# cuDNN graph API: the conv GPU tests and the training tests (ReLU masks from the GPU), memcheck
# over the graph API's search, aligned-view and bad-input tests; then the conv rows on PyTorch's
# own cuDNN 9.19 (libcudnn.so linked to it): forward and fused forward NHWC batch 32, three
# alternated pairs (peer, ours, ours, peer, peer, ours), one legacy-API run; then one pair of
# everything (both layouts, batch 32 and 1, every direction); the bf16 MLP block per GEMM on
# both sides (--breakdown)
set -x
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p .gpu/payload-bin && tar -C .gpu/payload-bin --strip-components=1 -xzf .gpu/payload.tgz bin/gemmbridge
G=.gpu/payload-bin/gemmbridge; mkdir -p /tmp/c
TC=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"); mkdir -p /tmp/tc; ln -sf $TC/libcudnn.so.9 /tmp/tc/libcudnn.so
L=/tmp/tc:$TC:$LD_LIBRARY_PATH
date +%T
LD_LIBRARY_PATH=$L timeout 150 bash .gpu/run tests --test-threads 2 legacy_api every_direction measured_search element_aligned bad_input random_mlps random_fp8 > /tmp/t.log 2>&1; echo "tests rc $?"
grep -E '^test |^test result|panicked|^offset' /tmp/t.log | grep -v 'ok. 0 passed\|^test .* ok$' | head -30
grep -A3 panicked /tmp/t.log | head -20
grep -E '^ok ' /tmp/t.log | head -4
cp /tmp/t.log $OUT/tests.log
date +%T
LD_LIBRARY_PATH=$L timeout 120 bash .gpu/run sanitize measured_search element_aligned bad_input > /tmp/s.log 2>&1; grep -E 'ERROR SUMMARY|^test result: [A-Z]' /tmp/s.log | sort | uniq -c; rm -f $OUT/sanitize.log; cp /tmp/s.log $OUT/sanitize.log
date +%T
A="--conv-layouts nhwc --conv-batches 32"
ours() { LD_LIBRARY_PATH=$L RUST_LOG=gemmbridge=info,gemmbridge_cli=info timeout 100 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused $A $2 --out /tmp/c/ours$1.jsonl > /dev/null 2>/tmp/c/ours$1.err; echo "ours$1 rc $?"; }
peer() { timeout 100 python3 bench/conv_peer.py --ops conv_fwd,conv_bias_relu --layouts nhwc --batches 32 --out /tmp/c/peer$1.jsonl 2>/dev/null; echo "peer$1 rc $?"; }
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3
ours -legacy "--conv-api legacy"
$G compare --ours /tmp/c/ours1.jsonl,/tmp/c/ours2.jsonl,/tmp/c/ours3.jsonl --peer /tmp/c/peer1.jsonl,/tmp/c/peer2.jsonl,/tmp/c/peer3.jsonl --bound 0.95 > /tmp/c/compare-fwd.txt; grep -v "^conv" /tmp/c/compare-fwd.txt | tail -12; grep "◂" /tmp/c/compare-fwd.txt | head -20
grep -h "convolution row" /tmp/c/ours1.err | head -3; grep -ch "legacy API" /tmp/c/ours1.err
date +%T
timeout 150 python3 bench/conv_peer.py --reps 10 --out /tmp/c/peer-all.jsonl 2>/dev/null; echo "peer-all rc $?"
LD_LIBRARY_PATH=$L timeout 150 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused,conv_dgrad,conv_wgrad --reps 10 --out /tmp/c/ours-all.jsonl > /dev/null 2>/tmp/c/ours-all.err; echo "ours-all rc $?"
$G compare --ours /tmp/c/ours-all.jsonl --peer /tmp/c/peer-all.jsonl --bound 0.95 > /tmp/c/compare-all.txt; grep -v "^conv" /tmp/c/compare-all.txt | tail -40
date +%T
timeout 60 python3 bench/train_peer.py --dtypes bf16 --ops mlp_train --breakdown 2>&1 | grep -v -i warn | tail -20
timeout 60 $G train-bench --dtypes bf16 --ops mlp_train --breakdown 2>&1 | tail -20
date +%T
tar -C /tmp -czf $OUT/conv.tgz c
