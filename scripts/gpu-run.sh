#!/bin/bash
# On a GPU machine without our build dependencies (see scripts/gpu-bundle.sh),
# from the repository root, as root:
#
#   scripts/gpu-run.sh [BUNDLE] [STEPS...]
#
# unpacks the bundle (binaries into ./build, libraries into /opt/ct-gpu/lib,
# PostgreSQL to the paths it was built for), then runs, each with a deadline:
#   facts  nvidia-smi, and cuobjdump's list of the agent's architectures
#   tests  `make test-gpu`'s tests: test_backends, test_gpu_check,
#          test_cuda_archs, test_join_gpu (one CUDA + two CPU peers)
#   bench  tests/bench/bench_gpu.sh: our bf16 step of GPT-2 small and
#          ALBERT-large, and PyTorch's GPT-2 small step (python3 there has
#          torch with CUDA)
# STEPS defaults to "facts tests bench". Logs go to $OUT (or /tmp/gpu-out):
# one .log per step and logs.tar.gz with the tests' own logs.
# CT_GPU_RUN_DEVICE=cpu checks the bundle itself on a machine without a GPU
# (a bare Debian root): the tests then run their CPU variants.
set -u
bundle=${1:-.gpu/bundle.tar.xz}
shift || true
steps=${*:-facts tests bench}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - t0 )) s: $*"; }

stamp "unpacking $bundle"
rm -rf /opt/ct-gpu && mkdir -p /opt/ct-gpu
xz -dc "$bundle" | tar -C /opt/ct-gpu -xf - || { echo "gpu-run: cannot unpack $bundle"; exit 1; }
tar -C / -xf /opt/ct-gpu/pg.tar
cp -a /opt/ct-gpu/repo/build . && chmod -R a+rX /opt/ct-gpu
# PostgreSQL refuses to run as root: the harness drops to the user postgres.
id postgres >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin postgres ||
    echo 'postgres:x:9432:9432::/nonexistent:/usr/sbin/nologin' >> /etc/passwd
# CUDA's libraries: the machine's toolkit, else the pip packages' copy.
cudalib=
for d in /usr/local/cuda/lib64 $(find /usr/local /usr/lib /opt -name libcublas.so.13 -printf '%h\n' 2>/dev/null); do
    [ -e "$d/libcublas.so.13" ] && [ -e "$d/libcudart.so.13" ] && { cudalib=$d; break; }
done
export CT_LD="/opt/ct-gpu/lib${cudalib:+:$cudalib}"
export LC_ALL=C TZ=UTC
dev=${CT_GPU_RUN_DEVICE:-cuda}
req=1
[ "$dev" = cuda ] || req=0
stamp "CUDA libraries from ${cudalib:-nowhere}"

run_step() { # name deadline command...
    local name=$1 secs=$2
    shift 2
    stamp "$name"
    timeout -k 10 "$secs" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    tail -n 40 "$out/$name.log"
    stamp "$name: exit $rc"
}

for s in $steps; do
    case $s in
    facts)
        run_step facts 60 sh -c 'nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,clocks.max.sm --format=csv;
            nvidia-smi -q | grep -i -E "cuda version|product name" ; command -v cuobjdump &&
            cuobjdump --list-elf build/bin/crowdtrain-agent && cuobjdump --list-ptx build/bin/crowdtrain-agent' ;;
    tests)
        run_step tests 300 env LD_LIBRARY_PATH="$CT_LD" CT_TEST_DEVICE=$dev CT_TEST_REQUIRE_GPU=$req CT_KEEP_LOGS=1 \
            ./scripts/run-tests.sh --suite gpu build/tests/unit/kernels/test_backends \
            build/tests/unit/kernels/test_gpu_check build/tests/unit/kernels/test_cuda_archs \
            build/tests/integ/test_join_gpu ;;
    bench)
        # PyTorch must not see our Debian libraries: its python3 runs without them.
        printf '#!/bin/sh\nexec env -u LD_LIBRARY_PATH python3 "$@"\n' > /opt/ct-gpu/python3
        chmod +x /opt/ct-gpu/python3
        run_step bench 240 env LD_LIBRARY_PATH="$CT_LD" BENCH_PYTHON=/opt/ct-gpu/python3 \
            PYTHONUNBUFFERED=1 tests/bench/bench_gpu.sh ;;
    *) echo "gpu-run: unknown step $s" ;;
    esac
done
# The tests' own logs (agents' and the coordinator's, kept by CT_KEEP_LOGS).
find build/test-logs /tmp/ct-* -maxdepth 3 -type f \( -name "*.log" -o -name "*.steps" \) -size -8M 2>/dev/null |
    tar -czf "$out/logs.tar.gz" -T - 2>/dev/null
stamp "done"
