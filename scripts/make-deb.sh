#!/bin/sh
# `make deb`: the Debian packages crowdtrain-agent and crowdtrain-coordinator
# from an existing build, with dpkg-deb.
#   scripts/make-deb.sh BUILD-DIR OUT-DIR
# The files are staged with scripts/install.sh (--prefix /usr, units in
# /lib/systemd/system as Debian 12's own packages have them). Version:
# VERSION + the commit's date and hash (0.1.0+git202611260902.6a121e2; a
# tree with uncommitted changes adds ".dirty"), so each commit's packages
# upgrade the previous ones'.
#
# Depends come from dpkg-shlibdeps, the tool debhelper uses: for every
# shared library the binary needs (its DT_NEEDED entries, resolved like the
# dynamic linker does) it finds the Debian package that ships it and that
# package's symbols/shlibs file, which gives the lowest version providing
# the symbols the binary actually uses. A library no package ships (a CUDA
# toolkit in /usr/local) is an error, not a silent omission: `make deb`
# builds with CUDA=0 for that reason.
set -eu
cd "$(dirname "$0")/.."
build=$1; out=$2
for t in dpkg-deb dpkg-shlibdeps; do
  command -v $t >/dev/null || { echo "make-deb: $t not found (apt-get install dpkg-dev)" >&2; exit 1; }
done

date=$(git log -1 --format=%cd --date=format:%Y%m%d%H%M)
hash=$(git rev-parse --short=7 HEAD)
version="$(cat VERSION)+git$date.$hash"
[ -z "$(git status --porcelain --untracked-files=no)" ] || version="$version.dirty"
arch=$(dpkg --print-architecture)
stage=$out/stage
rm -rf "$stage"
mkdir -p "$stage/debian" "$out"
rm -f "$out"/crowdtrain-*.deb
# dpkg-shlibdeps wants a debian/control to read; it needs nothing from it here.
printf 'Source: crowdtrain\n\nPackage: crowdtrain-agent\nArchitecture: any\n\nPackage: crowdtrain-coordinator\nArchitecture: any\n' \
  >"$stage/debian/control"

# subst FILE PKG: fills the maintainer-script templates
subst() {
  sed -e "s|@PKG@|$2|g" -e "s|@UNIT@|$unit|g" -e "s|@CONF@|$conf|g" -e "s|@STATEDIR@|$statedir|g" \
      -e "s|@MODE@|$mode|g" -e "s|@NEXT@|$next|g" -e "s|@PURGE@|$purge|g" -e "s|@PURGE_WHAT@|$purge_what|g" "$1"
}

pkg() { # name
  p=$1 root=$stage/debian/$1
  ./scripts/install.sh --build "$build" --destdir "$root" --prefix /usr --sysconfdir /etc \
    --unitdir /lib/systemd/system --only "${p#crowdtrain-}" >/dev/null
  strip --strip-unneeded "$root/usr/bin/$p"
  install -d -m 0755 "$root/usr/share/doc/$p"
  install -m 0644 README.md "$root/usr/share/doc/$p/README.md"
  install -d -m 0755 "$root/DEBIAN"
  deps=$(cd "$stage" && dpkg-shlibdeps -O "debian/$p/usr/bin/$p" | sed -n 's/^shlibs:Depends=//p')
  [ -n "$deps" ] || { echo "make-deb: no library dependencies found for $p" >&2; exit 1; }
  size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
  {
    echo "Package: $p"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: Crowdtrain developers <crowdtrain@localhost>"
    echo "Installed-Size: $size"
    echo "Depends: $deps, adduser"
    echo "Recommends: $recommends"
    [ -n "$suggests" ] && echo "Suggests: $suggests"
    echo "Section: net"
    echo "Priority: optional"
    printf 'Description: %s\n' "$description"
  } >"$root/DEBIAN/control"
  echo "/etc/crowdtrain/$conf" >"$root/DEBIAN/conffiles"
  for s in postinst prerm postrm; do
    subst "packaging/debian/$s.in" "$p" >"$root/DEBIAN/$s"
    chmod 0755 "$root/DEBIAN/$s"
  done
  dpkg-deb --root-owner-group -Zxz --build "$root" "$out/${p}_${version}_$arch.deb" >/dev/null
  echo "$out/${p}_${version}_$arch.deb"
  echo "  Depends: $deps, adduser"
}

unit=crowdtrain-agent.service conf=agent.conf statedir=/var/lib/crowdtrain/agent mode=0755
next="log in as the service's user (sudo -u crowdtrain crowdtrain-agent login --config-dir /var/lib/crowdtrain/agent ...), set run in /etc/crowdtrain/agent.conf, then systemctl enable --now crowdtrain-agent"
purge="rm -rf /var/lib/crowdtrain/agent"
purge_what="the agent's state (its key, session, passes, models)"
recommends="ca-certificates"
suggests="dataset-fashion-mnist"
description="Crowdtrain volunteer agent: train a neural network together
 The volunteer's side of Crowdtrain: logs in to a coordinator, joins a
 collaborative training run and trains with the other volunteers' agents,
 averaging gradients peer to peer. Runs as the crowdtrain-agent service at
 the lowest CPU priority once the volunteer has logged in (this build
 computes on the CPU)."
pkg crowdtrain-agent

unit=crowdtrain-coordinator.service conf=coordinator.conf statedir=/var/lib/crowdtrain/coordinator mode=0700
next="name the database in /etc/crowdtrain/coordinator.conf (database-url), create the first organizer (crowdtrain-coordinator create-user), then systemctl enable --now crowdtrain-coordinator"
purge=": kept: /var/lib/crowdtrain/coordinator holds the coordinator signing key"
purge_what="nothing of the coordinator's state: its signing key is in /var/lib/crowdtrain/coordinator, remove it by hand"
recommends="ca-certificates"
suggests="postgresql"
description="Crowdtrain coordinator: identity, runs and dashboard for collaborative training
 The stable backbone of a Crowdtrain collaboration: an HTTPS REST API over
 PostgreSQL for accounts, runs, allowlists, signed access passes,
 schedules, checkpoints and contribution accounting, a DHT backbone node
 per run, and the web dashboard. Runs as the crowdtrain-coordinator
 service."
pkg crowdtrain-coordinator
