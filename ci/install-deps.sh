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
)
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
  "${packages[@]}" >/dev/null
echo "install-deps: ${#packages[@]} packages present"
