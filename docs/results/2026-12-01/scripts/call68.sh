# cuDNN graph API with the wider measured search, the room's larger workspace and the prewarm:
# every conv GPU test (the capture test included), the random MLP tests three times (ReLU masks
# from the GPU), memcheck over the capture and aligned-view tests; the strict-f32 backward-data
# rows with the search's candidates logged; forward and fused forward NHWC batch 32 beside
# bench/conv_peer.py, three alternated pairs; one pair of everything. Our process runs on
# PyTorch's own cuDNN 9.19 (a libcudnn.so link to it first on the loader path).
set -x
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p .gpu/payload-bin && tar -C .gpu/payload-bin --strip-components=1 -xzf .gpu/payload.tgz bin/gemmbridge
G=.gpu/payload-bin/gemmbridge; mkdir -p /tmp/c
TC=$(python3 -c "import nvidia.cudnn as c; print(list(c.__path__)[0] + '/lib')"); mkdir -p /tmp/tc; ln -sf $TC/libcudnn.so.9 /tmp/tc/libcudnn.so
L=/tmp/tc:$TC:$LD_LIBRARY_PATH
date +%T
LD_LIBRARY_PATH=$L timeout 150 bash .gpu/run tests legacy_api every_direction measured_search element_aligned bad_input prewarmed random_mlps random_fp8 > /tmp/t.log 2>&1; echo "tests rc $?"
for i in 2 3; do LD_LIBRARY_PATH=$L timeout 60 bash .gpu/run tests random_mlps >> /tmp/t.log 2>&1; echo "random_mlps rc $?"; done
grep -E '^test result|panicked|^offset' /tmp/t.log | grep -v 'ok. 0 passed' | head -30
grep -A3 panicked /tmp/t.log | head -20
cp /tmp/t.log $OUT/tests.log
date +%T
LD_LIBRARY_PATH=$L timeout 100 bash .gpu/run sanitize prewarmed element_aligned > /tmp/s.log 2>&1; grep -E 'ERROR SUMMARY|^test result: [A-Z]' /tmp/s.log | sort | uniq -c; rm -f $OUT/sanitize.log; cp /tmp/s.log $OUT/sanitize.log
date +%T
LD_LIBRARY_PATH=$L RUST_LOG=gemmbridge=debug,gemmbridge_cli=info timeout 60 $G bench --ops conv_dgrad,conv_fwd --dtypes f32 --conv-layouts nhwc --conv-batches 32 --out /tmp/c/f32-debug.jsonl > /tmp/c/f32-debug.txt 2>/tmp/c/f32-debug.err; echo "f32 debug rc $?"
grep -c timed /tmp/c/f32-debug.err; grep -c "skipped" /tmp/c/f32-debug.err; grep "skipped: workspace" /tmp/c/f32-debug.err | head -3; grep "convolution row" /tmp/c/f32-debug.err | sed 's/.*problem=//' | cut -c1-250 | head -22
A="--conv-layouts nhwc --conv-batches 32"
ours() { LD_LIBRARY_PATH=$L RUST_LOG=gemmbridge=info,gemmbridge_cli=info timeout 100 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused $A --out /tmp/c/ours$1.jsonl > /dev/null 2>/tmp/c/ours$1.err; echo "ours$1 rc $?"; }
peer() { timeout 100 python3 bench/conv_peer.py --ops conv_fwd,conv_bias_relu --layouts nhwc --batches 32 --out /tmp/c/peer$1.jsonl 2>/dev/null; echo "peer$1 rc $?"; }
peer 1; ours 1; ours 2; peer 2; peer 3; ours 3
$G compare --ours /tmp/c/ours1.jsonl,/tmp/c/ours2.jsonl,/tmp/c/ours3.jsonl --peer /tmp/c/peer1.jsonl,/tmp/c/peer2.jsonl,/tmp/c/peer3.jsonl --bound 0.95 > /tmp/c/compare-fwd.txt; grep -v "^conv" /tmp/c/compare-fwd.txt | tail -12; grep "◂" /tmp/c/compare-fwd.txt | head -20
grep -ch "legacy API" /tmp/c/ours1.err
date +%T
timeout 150 python3 bench/conv_peer.py --reps 10 --out /tmp/c/peer-all.jsonl 2>/dev/null; echo "peer-all rc $?"
LD_LIBRARY_PATH=$L timeout 170 $G bench --ops conv_fwd,conv_bias_relu,conv_bias_relu_unfused,conv_dgrad,conv_wgrad --reps 10 --out /tmp/c/ours-all.jsonl > /dev/null 2>/tmp/c/ours-all.err; echo "ours-all rc $?"
$G compare --ours /tmp/c/ours-all.jsonl --peer /tmp/c/peer-all.jsonl --bound 0.95 > /tmp/c/compare-all.txt; grep -v "^conv" /tmp/c/compare-all.txt | tail -42
date +%T
tar -C /tmp -czf $OUT/conv.tgz c
