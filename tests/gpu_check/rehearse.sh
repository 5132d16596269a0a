# shellcheck shell=bash disable=SC2034,SC2154 # sourced: root, work and B are the script's
# Sourced by ci/gpu-check.sh --rehearse: the stand-ins for what a GPU
# machine carries, so that every stage runs on a CPU machine (CI's tests,
# tests/CMakeLists.txt). Each is a default that a test may override.
#   FAKE_LIB_MISSING=NAME   leave this library out of the fake directory
#   FAKE_NVSMI_*            the fake nvidia-smi's answers (bin/nvidia-smi)
here=$root/tests/gpu_check
: "${GPU_CHECK_PACK:=$here/PACK}"
: "${GPU_CHECK_DATA:=/usr/share/datasets/fashion-mnist}"
: "${GPU_CHECK_NVIDIA_SMI:=$here/bin/nvidia-smi}"
: "${GPU_CHECK_SANITIZER:=$here/bin/compute-sanitizer}"
: "${GPU_CHECK_BENCH:=$here/fake-bench.sh}"
# a few validate cases (all of them take minutes here)
: "${GPU_CHECK_VALIDATE_ARGS:=--op softmax*}"

# the libraries a CUDA 13 / cuDNN 9 pack needs, as empty files
if [ -z "${GPU_CHECK_LIBDIRS:-}" ]; then
  GPU_CHECK_LIBDIRS=$work/fake-libs
  mkdir -p "$GPU_CHECK_LIBDIRS"
  for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libnccl.so.2 \
           libcudnn{,_graph,_ops,_cnn,_adv,_heuristic,_engines_precompiled,_engines_runtime_compiled}.so.9; do
    [ "$l" = "${FAKE_LIB_MISSING:-}" ] || : > "$GPU_CHECK_LIBDIRS/$l"
  done
fi

# the GPU suites' stand-in: a quick CPU suite of the build, in a CTest
# directory of its own (the build's Testing/ belongs to the ctest running us)
if [ -z "${GPU_CHECK_CTEST_DIR:-}" ]; then
  GPU_CHECK_CTEST_DIR=$work/ctest
  GPU_CHECK_CTEST_RE=test_device_cpu
  mkdir -p "$GPU_CHECK_CTEST_DIR"
  echo "add_test(test_device_cpu \"$B/tests/test_device_cpu\")" > "$GPU_CHECK_CTEST_DIR/CTestTestfile.cmake"
fi
