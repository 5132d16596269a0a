#!/usr/bin/env bash
# Installs the Debian 12 packages blueprint builds and tests with.
# Idempotent: apt-get skips what is already installed.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config   # toolchain
  clang libclang-rt-14-dev                       # second compiler; its sanitizer runtime
  check                                          # unit tests
  libyaml-dev                                    # model files
  zlib1g-dev                                     # gzip'd IDX data
  libopenblas-dev                                # ops/blas GEMM kernels (OpenBLAS)
  libdnnl-dev                                    # oneDNN: ops/blas GEMMs (bp_ops_dnnl), ops/onednn convolutions
  libxnnpack-dev libpthreadpool-dev              # ops/xnnpack forward kernels (bp_ops_xnnpack)
  libopenmpi-dev openmpi-bin                     # mpirun ranks (ops/allreduce mpi)
  dataset-fashion-mnist                          # default data set (test_data_fashion_mnist)
  python3                                        # JSON checks in the CLI tests
  libprotobuf-c-dev protobuf-c-compiler          # ONNX files (frontend/: protoc-c at build time)
  libonnx-dev                                    # ONNX's schema, onnx.proto (frontend/)
  python3-onnx python3-venv python3-matplotlib   # ONNX checker; the venv below; bench/plot_runs.py
  python3-torch                                  # torch.onnx's twins for the ONNX import check (tests/onnx/import_torch.py); bench/'s twins
)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  "${packages[@]}" >/dev/null
# ONNX Runtime for the ONNX agreement test (tests/onnx/): from PyPI into
# .venv beside this script's repository, over Debian's numpy and onnx; the
# test skips with a message where this fails (no network)
root=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -x "$root/.venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$root/.venv" || echo "install-deps: no venv (python3-venv)"
fi
if [ -x "$root/.venv/bin/pip" ]; then
  "$root/.venv/bin/pip" install -q onnxruntime ||
    echo "install-deps: onnxruntime not installed (the ONNX agreement test will skip)"
fi
echo "install-deps: ${#packages[@]} packages present"
