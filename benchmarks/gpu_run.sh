#!/usr/bin/env bash
# Issue 20's GPU checks in one command, from the repository root of a CUDA machine:
#
#     bash benchmarks/gpu_run.sh
#
# Nothing is installed: ember.aotgraph and ember.inductor are imported from the source tree
# (ember's capture needs CPython 3.11; these two run on 3.12 and torch 2.11 as well). Runs the
# GPU tests (skipped on machines without CUDA), then benchmarks/gpu_check.py (correctness,
# steady speed, cold and warm compile, reduce-overhead, max-autotune, a cold-compile profile).
# Full logs go to $OUT (or /tmp): gpu-tests.log, gpu-check.log.
set -u
out=${OUT:-/tmp}
export PYTHONPATH=packages/aotgraph/src:packages/inductor/src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch',
torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
start=$(date +%s)
timeout "${GPU_TESTS_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider -n 4 \
    packages/inductor/tests/test_triton_cuda.py packages/aotgraph/tests/test_cudagraphs.py \
    >"$out/gpu-tests.log" 2>&1
echo "tests: rc=$? in $(($(date +%s) - start)) s"
grep -E "passed|failed|error|FAILED|ERROR" "$out/gpu-tests.log" | tail -30
start=$(date +%s)
timeout "${GPU_CHECK_TIMEOUT:-400}" python3 benchmarks/gpu_check.py --quick --profile \
    >"$out/gpu-check.log" 2>&1
echo "gpu_check: rc=$? in $(($(date +%s) - start)) s"
# the tables and failures (the profile stays in the log)
grep -E "^\||^geomean|FAIL|Error|error:|^python|^GPU" "$out/gpu-check.log" | head -80
