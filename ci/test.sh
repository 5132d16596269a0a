#!/usr/bin/env bash
# Configures, builds and runs every test.
#   ci/test.sh            gcc, Release (-O3, NDEBUG; plus -g for backtraces), in build/:
#                         what a user's -DCMAKE_BUILD_TYPE=Release builds
#   ci/test.sh sanitize   clang, AddressSanitizer + UndefinedBehaviorSanitizer, in build-sanitize/
#   ci/test.sh thread     clang, ThreadSanitizer, in build-tsan/: the suites whose
#                         threads share memory (ranks, all-reduce, loader, resume,
#                         the per-rank thread pool, kernel state under two ranks,
#                         the device seam's streams and staging)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-normal}
filter=()
targets=()
# Debug (assertions on) at -O1, as the sanitizers' own documentation advises:
# at -O0 the plain-C reference kernels under ASan made the sanitizer pass's
# tests take 10 minutes on two cores
sanitize_opt=(-DCMAKE_BUILD_TYPE=Debug "-DCMAKE_C_FLAGS_DEBUG=-g -O1")
case "$mode" in
  # -g changes no generated code, so this proves Release's warnings and bits
  normal) dir=build; args=(-DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS_RELEASE=-O3 -DNDEBUG -g") ;;
  sanitize)
    dir=build-sanitize
    # no bp_ops_dnnl, no bp_ops_onednn: oneDNN's OpenMP runtime (libgomp, uninstrumented)
    # crashes LeakSanitizer's exit-time tracer ("Tracer caught signal 11");
    # its kernels are bp_ops_blas's sources, checked here through that module
    # no CUDA: the CUDA libraries the cuda modules link (cuBLAS, cuDNN, NCCL) carry their own
    # C++ runtime, whose exception pool LeakSanitizer reports as leaked once the module is
    # unloaded; without a GPU nothing of theirs runs anyway (the C side of those modules is
    # checked in the normal build)
    args=(-DBP_SANITIZE=ON "${sanitize_opt[@]}" -DCMAKE_C_COMPILER=clang -DBP_WITH_CUDA=OFF
          -DBP_WITH_DNNL=OFF -DBP_WITH_ONEDNN=OFF)
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    # validate over every node of a whole model (FP32 and FP16 twins, each
    # case a forked child) tests XNNPACK's and Winograd's numbers, which the normal build
    # checks; under the sanitizers it took over 10 minutes. Every other
    # suite, validate's own included, runs here. The ONNX agreement runs
    # (whole training runs and 10,000 predictions per model, tests/onnx/)
    # likewise stay in the normal build; test_onnx checks the ONNX reader
    # and writer here
    filter=(-E "^(validate_(xnnpack|onednn|winograd)_passes_every_node_of_|onnx_export_agrees|onnx_import_of)")
    ;;
  thread)
    dir=build-tsan
    args=(-DBP_SANITIZE=thread "${sanitize_opt[@]}" -DCMAKE_C_COMPILER=clang -DBP_WITH_CUDA=OFF
          -DBP_WITH_DNNL=OFF -DBP_WITH_ONEDNN=OFF)
    export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
    # OpenBLAS's worker threads hand results back through synchronization in
    # uninstrumented code, which TSan cannot see (a GEMM's beta = 0 memset
    # then looks unordered with the peer rank that reads the gradient); with
    # one thread per rank (BP_THREADS: the CLI reads it, the suites pass it
    # as bp_train_options.threads through tests/test_env.h; the BLAS
    # kernels take the rank's count) OpenBLAS runs in the calling rank,
    # where every write is ordered by our own barriers and checked
    export BP_THREADS=1
    suites=(test_allreduce test_train_ranks test_data_loader test_train_resume test_threads
            test_kernel_state test_device_seam test_streams)
    filter=(-R "^($(IFS='|'; echo "${suites[*]}"))$")
    # those suites, the libraries, the CLI and every module they may load
    # (core/, the libraries above it, cli/, ops/, plugins/ and the test
    # modules): not the other suites, the benches, the examples
    targets=(--target core/all frontend/all data/all validate/all trainer/all cli/all
             ops/all plugins/all tests/modules/all "${suites[@]}")
    ;;
  *) echo "ci/test.sh: unknown mode '$mode' (normal, sanitize or thread)" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja "${args[@]}"
cmake --build "$dir" -j "$(nproc)" "${targets[@]}"
ctest --test-dir "$dir" -j "$(nproc)" --output-on-failure "${filter[@]}"
