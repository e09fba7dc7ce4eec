#!/bin/sh
# Installs Crowdtrain's binaries, dashboard, systemd units and example
# configuration (`make install`; scripts/make-deb.sh stages the Debian
# packages with it too).
#   scripts/install.sh [--build DIR] [--destdir DIR] [--prefix DIR]
#                      [--sysconfdir DIR] [--unitdir DIR] [--only agent|coordinator]
#                      [--setup-system]
# Defaults: build, no destdir, /usr/local, /etc, PREFIX/lib/systemd/system
# (systemd looks there for /usr/local and /usr). Files land in:
#   PREFIX/bin/crowdtrain-{agent,coordinator}
#   PREFIX/share/crowdtrain/web/          the dashboard (the coordinator finds
#                                         it next to its binary: ../share/crowdtrain/web)
#   PREFIX/share/crowdtrain/examples/     recipes and dataset manifests
#   UNITDIR/crowdtrain-{agent,coordinator}.service   (paths filled in)
#   SYSCONFDIR/crowdtrain/{agent,coordinator}.conf   (kept when present)
# --setup-system (root, no destdir) also creates the system user crowdtrain
# and /var/lib/crowdtrain/{agent,coordinator}, as the Debian packages'
# postinst does (packaging/debian/postinst.in).
set -eu
cd "$(dirname "$0")/.."
build=build destdir="" prefix=/usr/local sysconfdir=/etc unitdir="" only="" setup=0
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --destdir) destdir=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    --sysconfdir) sysconfdir=$2; shift 2 ;;
    --unitdir) unitdir=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --setup-system) setup=1; shift ;;
    *) echo "install.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$unitdir" ] || unitdir=$prefix/lib/systemd/system
case $only in ""|agent|coordinator) ;; *) echo "install.sh: --only agent|coordinator" >&2; exit 2 ;; esac
want() { [ -z "$only" ] || [ "$only" = "$1" ]; }

D=$destdir
need() { [ -e "$1" ] || { echo "install.sh: $1 is missing (run make first)" >&2; exit 1; }; }

unit() { # name: fill in the paths of packaging/systemd/NAME.service.in
  install -d -m 0755 "$D$unitdir"
  sed -e "s|@BINDIR@|$prefix/bin|g" -e "s|@SYSCONFDIR@|$sysconfdir|g" \
    "packaging/systemd/$1.service.in" >"$D$unitdir/$1.service"
  chmod 0644 "$D$unitdir/$1.service"
}
conf() { # name: an example configuration, never over one that exists
  install -d -m 0755 "$D$sysconfdir/crowdtrain"
  if [ -e "$D$sysconfdir/crowdtrain/$1.conf" ]; then
    echo "install.sh: keeping $D$sysconfdir/crowdtrain/$1.conf"
  else
    install -m 0644 "packaging/etc/$1.conf" "$D$sysconfdir/crowdtrain/$1.conf"
  fi
}

if want coordinator; then
  need "$build/bin/crowdtrain-coordinator"
  [ -e "$build/web/dist/index.html" ] || {
    echo "install.sh: $build/web/dist/index.html is missing: the dashboard is built by make when node and npm are installed (scripts/install-deps.sh)" >&2
    exit 1
  }
  install -d -m 0755 "$D$prefix/bin" "$D$prefix/share/crowdtrain/web"
  install -m 0755 "$build/bin/crowdtrain-coordinator" "$D$prefix/bin/"
  # a new build's hashed file names replace the old ones
  rm -f "$D$prefix/share/crowdtrain/web"/*
  install -m 0644 "$build"/web/dist/* "$D$prefix/share/crowdtrain/web/"
  unit crowdtrain-coordinator
  conf coordinator
fi
if want agent; then
  need "$build/bin/crowdtrain-agent"
  install -d -m 0755 "$D$prefix/bin" "$D$prefix/share/crowdtrain/examples"
  install -m 0755 "$build/bin/crowdtrain-agent" "$D$prefix/bin/"
  install -m 0644 examples/*.json "$D$prefix/share/crowdtrain/examples/"
  unit crowdtrain-agent
  conf agent
fi

if [ "$setup" = 1 ]; then
  [ -z "$D" ] && [ "$(id -u)" -eq 0 ] || { echo "install.sh: --setup-system needs root and no destdir" >&2; exit 1; }
  # useradd: every distribution has it (the Debian packages use adduser)
  nologin=$(command -v nologin || echo /usr/sbin/nologin)
  getent passwd crowdtrain >/dev/null ||
    useradd --system --user-group --home-dir /var/lib/crowdtrain --no-create-home \
      --shell "$nologin" --comment "Crowdtrain services" crowdtrain
  install -d -m 0755 /var/lib/crowdtrain
  want coordinator && install -d -m 0700 -o crowdtrain -g crowdtrain /var/lib/crowdtrain/coordinator
  want agent && install -d -m 0755 -o crowdtrain -g crowdtrain /var/lib/crowdtrain/agent
  command -v systemctl >/dev/null && [ -d /run/systemd/system ] && systemctl daemon-reload || true
fi
