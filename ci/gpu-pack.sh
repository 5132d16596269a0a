#!/usr/bin/env bash
# Packs what ci/gpu-check.sh needs into .gpu/ (ignored by git), on a machine
# with this project's Debian packages and CUDA 13 (nvcc, cuDNN 9, cuBLAS),
# for a GPU machine that has a driver, CUDA and PyTorch but none of those
# packages and no network (ci/README.md, "GPU check"):
#
#   .gpu/build   a Release build with CUDA and the tests, without XNNPACK,
#                oneDNN, OpenBLAS and MPI (nothing the GPU check needs);
#                its object files are kept aside in build-gpu-objects/
#                between packs, so a repack rebuilds only what changed
#   .gpu/lib     the shared libraries of Debian's the binaries load and a
#                bare machine lacks (libyaml, zlib, subunit, ...); never
#                glibc, libstdc++, libgcc_s or CUDA's own libraries, which
#                gpu-check.sh takes from the machine (or PyTorch's wheels)
#   .gpu/data    Fashion-MNIST (the dataset-fashion-mnist package's files)
#   .gpu/PACK    where and from what the pack was made
#
# The build's paths are absolute: gpu-check.sh links this checkout's path
# to the copy's when they differ. Prints the device call to make.
#   JOBS=N       parallel build jobs (default 2)
#   CUDA_ARCH=A  CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200 SASS and PTX);
#                PACK records it, and gpu-check.sh's env stage holds the GPU to it
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)
pack=.gpu
build=$pack/build
stash=build-gpu-objects # /build*/ in .gitignore
limit_mib=60

die() { echo "gpu-pack: $*" >&2; exit 1; }
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || die "no nvcc: the pack needs CUDA"
[ -d /usr/share/datasets/fashion-mnist ] || die "no Fashion-MNIST (apt-get install dataset-fashion-mnist)"
mkdir -p "$pack"

# object files back in place for an incremental build
if [ -d "$stash" ]; then
  (cd "$stash" && find . -type d -name CMakeFiles -prune -print) | while read -r d; do
    mkdir -p "$build/$(dirname "$d")"
    rm -rf "${build:?}/$d"
    mv "$stash/$d" "$build/$d"
  done
  rm -rf "$stash"
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBP_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
  -DBP_WITH_XNNPACK=OFF -DBP_WITH_ONEDNN=OFF -DBP_WITH_DNNL=OFF -DBP_WITH_BLAS=OFF \
  -DBP_WITH_MPI=OFF -DBP_BUILD_TESTS=ON -DBP_SANITIZE=OFF >"$pack/configure.log" ||
  { cat "$pack/configure.log"; die "configure failed"; }
grep -q '^BP_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" || die "CUDA is off in $build"
# what the check runs: the command, every module, the GPU suites and the test modules
# (a test that runs another test's executable is no target of its own)
all_targets=$(cmake --build "$build" --target help | sed -n 's/^\([A-Za-z0-9_]*\): .*/\1/p' | sort -u)
targets=(blueprint_cli)
while read -r t; do targets+=("$t"); done < <(grep '^bp_' <<< "$all_targets")
while read -r t; do
  grep -qx "$t" <<< "$all_targets" && targets+=("$t")
done < <(ctest --test-dir "$build" -N -R 'cuda|cudnn|cublas|nccl|graph_replay' | sed -n 's/^ *Test *#[0-9]*: //p')
echo "gpu-pack: building ${#targets[@]} targets in $build"
cmake --build "$build" -j "${JOBS:-2}" --target "${targets[@]}"

# Debian's libraries the binaries load that a bare machine lacks
rm -rf "$pack/lib" && mkdir -p "$pack/lib"
find "$build" -type f \( -name '*.so*' -o -perm -u+x \) ! -path '*/CMakeFiles/*' -print0 |
  xargs -0 file -L | sed -n 's/^\([^:]*\): *ELF.*/\1/p' |
  while read -r f; do ldd "$f" 2>/dev/null || true; done |
  sed -n 's/^[[:space:]]*\([^ ]*\) => \(\/[^ ]*\) .*/\1 \2/p' | sort -u |
  while read -r name path; do
    case "$path" in /lib/x86_64-linux-gnu/*|/usr/lib/x86_64-linux-gnu/*) ;; *) continue ;; esac
    case "$name" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|ld-linux*|libgcc_s.so*|\
      libstdc++.so*|libcuda.so*|libnvidia*) continue ;;
    esac
    cp -L "$path" "$pack/lib/$name"
  done || die "copying the libraries failed"

rm -rf "$pack/data" && mkdir -p "$pack/data/fashion-mnist"
cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$pack/data/fashion-mnist/"

# object files aside: they stay here, the rest travels
(cd "$build" && find . -type d -name CMakeFiles -prune -print) | while read -r d; do
  mkdir -p "$stash/$(dirname "$d")"
  mv "$build/$d" "$stash/$d"
done

{
  echo "source $root"
  echo "build $root/$build"
  echo "packed $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown) (plus uncommitted changes, if any)"
  echo "nvcc $( (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "cudnn $(sed -n 's/^-- cuDNN \([0-9.]*\).*/\1/p' "$pack/configure.log" | head -n 1)"
  # what gpu-check.sh's env stage holds the machine to: the driver the CUDA
  # major needs, the cuDNN libraries it loads, the GPU's compute capability
  echo "cuda_major $( (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
  echo "cudnn_major $(sed -n 's/^-- cuDNN \([0-9]*\).*/\1/p' "$pack/configure.log" | head -n 1)"
  echo "cuda_arch $(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
  echo "libs $(cd "$pack/lib" && ls | tr '\n' ' ')"
} > "$pack/PACK"

pack_kib=$(du -sk "$pack" | cut -f1)
tree_kib=$( (git ls-files -co --exclude-standard -z | du -ck --files0-from=- 2>/dev/null || true) |
  tail -n 1 | cut -f1)
total_mib=$(( (pack_kib + tree_kib + 1023) / 1024 ))
echo "gpu-pack: .gpu is $((pack_kib / 1024)) MiB, the working tree $((tree_kib / 1024)) MiB: $total_mib MiB travel"
cat "$pack/PACK"
[ "$total_mib" -le "$limit_mib" ] || die "$total_mib MiB is over the $limit_mib MiB budget (64 MiB travel at most)"
cat <<EOF
gpu-pack: ready. On a session with a GPU, make these two device calls, the second
at once after the first (ci/README.md, "GPU check"; summary.txt comes back from \$OUT):
  run(command="ci/gpu-check.sh", carry=[".gpu"], timeout_s=420)
  run(command="ci/gpu-check.sh --bench", carry=[".gpu"], timeout_s=360)
EOF
