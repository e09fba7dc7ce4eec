#!/bin/sh
# Packs what `make test-gpu` and the GPU benchmark need for a GPU machine that
# has the NVIDIA driver and CUDA runtime but none of our Debian build or test
# dependencies (the lent H100/H200 machines: an Ubuntu image with CUDA and
# PyTorch, no PostgreSQL, no libmicrohttpd, no network):
#
#   scripts/gpu-bundle.sh [DIR]      (default DIR: .gpu, ignored by git)
#
# DIR/bundle.tar.xz holds build/bin, the GPU tests, bench_gpu_train and every
# shared library they and PostgreSQL link except glibc's, libstdc++/libgcc_s
# (the machine's are newer) and CUDA's (the machine's match its driver),
# plus PostgreSQL's server tree (/usr/lib/postgresql/N, /usr/share/postgresql/N)
# and the UTC zone files. scripts/gpu-run.sh unpacks it there and runs the
# checks. It builds what it packs first (make CUDA=1).
set -eu
dir=${1:-.gpu}
build=${BUILD:-build}
bins="$build/bin/crowdtrain-agent $build/bin/crowdtrain-coordinator
$build/tests/unit/kernels/test_backends $build/tests/unit/kernels/test_gpu_check
$build/tests/unit/kernels/test_cuda_archs $build/tests/integ/test_join_gpu
$build/tests/bench/bench_gpu_train"
# Build (or bring up to date) exactly what goes in: `make` alone does not
# rebuild the benchmarks.
${MAKE:-make} --no-print-directory CUDA=1 BUILD="$build" $bins >/dev/null ||
    { echo "gpu-bundle: make CUDA=1 failed"; exit 1; }
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$pgbin" ] || { echo "gpu-bundle: no PostgreSQL server under /usr/lib/postgresql"; exit 1; }
pgroot=${pgbin%/bin}
pgver=${pgroot##*/}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/repo" "$stage/lib"
for b in $bins; do
    mkdir -p "$stage/repo/$(dirname "$b")"
    cp -a "$b" "$stage/repo/$b"
done
# Every non-system library the programs load (PostgreSQL's modules that
# initdb loads too: plpgsql, the snowball dictionaries).
objs="$bins $pgbin/postgres $pgbin/initdb $pgroot/lib/plpgsql.so $pgroot/lib/dict_snowball.so"
for o in $objs; do
    ldd "$o" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
done | sort -u | while read -r lib; do
    case ${lib##*/} in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|ld-linux*) ;;
        libstdc++.so*|libgcc_s.so*) ;;
        libcuda.so*|libcudart.so*|libcublas*.so*|libnvidia*) ;;
        *) cp -L "$lib" "$stage/lib/" ;;
    esac
done
tar -C / --exclude=bitcode --exclude="llvmjit*" -cf "$stage/pg.tar" "${pgroot#/}" "usr/share/postgresql/$pgver" \
    usr/share/zoneinfo/UTC usr/share/zoneinfo/Etc/UTC usr/share/zoneinfo/GMT
mkdir -p "$dir"
tar -C "$stage" -cf - repo lib pg.tar | xz -T0 -6 > "$dir/bundle.tar.xz.tmp"
mv "$dir/bundle.tar.xz.tmp" "$dir/bundle.tar.xz"
echo "gpu-bundle: $dir/bundle.tar.xz ($(du -h "$dir/bundle.tar.xz" | cut -f1)): $(ls "$stage/lib" | wc -l) libraries, PostgreSQL $pgver"
