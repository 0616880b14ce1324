#!/usr/bin/env bash
# The GPU checks of docs/gpu.md ("Running the GPU checks") in two steps, for GPU machines that
# have no Rust toolchain:
#
#   bash bench/gpu_checks.sh build        # here (Rust, no GPU needed): binaries into .gpu/
#   bash bench/gpu_checks.sh run [DIR]    # on the GPU machine, from the repository root,
#                                         # with .gpu/ carried over; logs into DIR (default .gpu/out)
#
# `run` runs every test of tests/cuda.rs (the two-GPU test says SKIPPED with fewer than two
# GPUs) and tests/cuda_local.rs, all_reduce on 2, 4 and 8 ranks sharing GPU 0 through the
# device-local path and through host staging, `collectix bench --device cuda` for all_reduce
# from 1 MiB to 1 GiB next to
# torch.distributed's NCCL figures (bench/torch_nccl.py, when torch is there), and with two
# GPUs or more, send_recv between GPU 0 and GPU 1 on NCCL. Each step's output goes to its own
# log; a failing step is reported and the others still run; the exit status is the number of
# failed steps.
set -u
cd "$(git rev-parse --show-toplevel 2>/dev/null || pwd)" || exit 1

case "${1:-}" in
build)
    set -e
    mkdir -p .gpu
    cargo build --release --features cuda -p collectix-cli
    cp target/release/collectix .gpu/collectix
    for t in cuda cuda_local; do
        bin=$(cargo test --release --features cuda --test "$t" --no-run --message-format=json 2>/dev/null |
            sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
        [ -n "$bin" ] || { echo "no test binary was built for tests/$t.rs" >&2; exit 1; }
        cp "$bin" ".gpu/${t}_tests"
    done
    echo "built .gpu/collectix, .gpu/cuda_tests and .gpu/cuda_local_tests; carry .gpu/ to the GPU machine and run: bash bench/gpu_checks.sh run"
    ;;
run)
    out=${2:-.gpu/out}
    mkdir -p "$out"
    failed=0
    step() {
        local name=$1
        shift
        echo "== $name: $*"
        if "$@" >"$out/$name.log" 2>&1; then
            echo "   ok ($out/$name.log)"
        else
            echo "   FAILED, rc $? ($out/$name.log):"
            tail -n 20 "$out/$name.log" | sed 's/^/   | /'
            failed=$((failed + 1))
        fi
    }
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi -L >"$out/gpus.log" 2>&1 || true
    else
        echo "no nvidia-smi here" >"$out/gpus.log"
    fi
    gpus=$(grep -c '^GPU' "$out/gpus.log" || true)
    echo "== $gpus GPU(s): $(tr '\n' ' ' <"$out/gpus.log")"
    step cuda_tests .gpu/cuda_tests --test-threads=1 --nocapture
    step cuda_local_tests .gpu/cuda_local_tests --test-threads=1 --nocapture
    # Ranks sharing the one GPU: the device-local path (the default backend), then host
    # staging, for the same sizes.
    for n in 2 4 8; do
        step "bench_local_$n" .gpu/collectix bench --device cuda --ranks "$n" --collective all_reduce -b 4 -e 256M -f 16 -n 5
        step "bench_staged_$n" .gpu/collectix bench --device cuda --ranks "$n" --backend staged --collective all_reduce -b 4 -e 64M -f 16 -n 3
    done
    for c in all_gather reduce_scatter broadcast all_to_all; do
        step "bench_local_4_$c" .gpu/collectix bench --device cuda --ranks 4 --collective "$c" -b 4K -e 64M -f 128 -n 5
    done
    step bench_all_reduce .gpu/collectix bench --device cuda --ranks 1 --collective all_reduce -b 1M -e 1G -f 4 -n 10
    if python3 -c 'import torch' 2>/dev/null; then
        step torch_nccl python3 bench/torch_nccl.py 1024
    else
        echo "== torch_nccl: skipped (no torch for python3 here)"
    fi
    if [ "${gpus:-0}" -ge 2 ]; then
        step bench_send_recv .gpu/collectix bench --device cuda --ranks 2 --collective send_recv -b 4K -e 256M -f 8 -n 10
    else
        echo "== bench_send_recv: skipped (needs two GPUs)"
    fi
    echo "== $failed step(s) failed"
    exit "$failed"
    ;;
*)
    echo "usage: bash bench/gpu_checks.sh build | run [DIR]" >&2
    exit 2
    ;;
esac
