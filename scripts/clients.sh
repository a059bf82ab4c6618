#!/usr/bin/env bash
# Client programs for the tests (issue "kube-apiserver as the oracle" §1/§3),
# built from their Go modules under tests/clients/go/ and cached outside the
# clone; binaries are never committed.
#
#   scripts/clients.sh [NAME...]         build what is missing (default: all),
#                                        then print "NAME PATH"
#   scripts/clients.sh --print NAME...   print each binary's path, build
#                                        nothing; exit 1 if one is not cached
#
# NAME (program directory, modfile, the module whose version keys the cache):
#   informer         tests/clients/go/informer    go.mod      k8s.io/client-go (v0.34)
#   informer-latest  tests/clients/go/informer    latest.mod  k8s.io/client-go (the newest
#                    the Go module proxy serves: `go list -m -versions k8s.io/client-go`)
#   etcdclient-3.6   tests/clients/go/etcdclient  go.mod      go.etcd.io/etcd/client/v3 (v3.6)
#   etcdclient-3.7   tests/clients/go/etcdclient  go.37.mod   go.etcd.io/etcd/client/v3 (v3.7)
#   porcupine        tests/clients/go/porcupine   go.mod      github.com/anishathalye/porcupine
#                    (the linearizability checker of `watchcache-bench chaos --front grpc`)
# One program (main.go, and chaos.go for etcdclient) per directory, built
# against each modfile with `go build -modfile`.
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/watchcache/clients/
#   <name>-<module version>-<sha256 of *.go + mod + sum, 12 hex>/<binary>
# so a change to the program or its dependencies builds a new binary. A build
# goes to a temporary directory beside it, renamed into place when done; a
# flock keeps two runs from building the same one. Go runs under `nice -n 10`
# with CGO_ENABLED=0, GOWORK=off, GOFLAGS=-mod=readonly (go.sum is committed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/watchcache/clients"
CLIENTS="informer informer-latest etcdclient-3.6 etcdclient-3.7 porcupine"

log() { printf '%s clients: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The program (its directory's and binary's name) of a client NAME.
bin_of() {
  case $1 in
    informer | informer-latest) echo informer ;;
    etcdclient-3.6 | etcdclient-3.7) echo etcdclient ;;
    porcupine) echo porcupine ;;
    *) die "unknown client: $1" ;;
  esac
}
src_of() { echo "$ROOT/tests/clients/go/$(bin_of "$1")"; }
mod_of() {
  case $1 in
    informer-latest) echo latest.mod ;;
    etcdclient-3.7) echo go.37.mod ;;
    *) echo go.mod ;;
  esac
}
module_of() {
  case $1 in
    informer*) echo k8s.io/client-go ;;
    porcupine) echo github.com/anishathalye/porcupine ;;
    *) echo go.etcd.io/etcd/client/v3 ;;
  esac
}

path_of() { # name -> cached binary path
  local src mod module version sha
  src=$(src_of "$1")
  mod=$(mod_of "$1")
  module=$(module_of "$1")
  [ -f "$src/$mod" ] || die "$1: no $src/$mod"
  version=$(awk -v m="$module" '$1 == m { print $2; exit }' "$src/$mod")
  [ -n "$version" ] || die "$1: no $module in $mod"
  sha=$(cat "$src"/*.go "$src/$mod" "$src/${mod%.mod}.sum" | sha256sum | cut -c1-12)
  echo "$CACHE/$1-$version-$sha/$(bin_of "$1")"
}

build() { # name
  local name=$1 src mod bin dir tmp start
  src=$(src_of "$name")
  mod=$(mod_of "$name")
  bin=$(path_of "$name")
  dir=$(dirname "$bin")
  [ -x "$bin" ] && return 0
  mkdir -p "$CACHE"
  exec 9>"$dir.lock"
  flock 9
  if [ ! -x "$bin" ]; then
    tmp=$(mktemp -d "$dir.tmp.XXXXXX")
    start=$(date +%s)
    log "building $name into $dir"
    if ! (cd "$src" && CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=readonly \
          nice -n 10 go build -modfile "$mod" -trimpath -o "$tmp/$(bin_of "$name")" .); then
      rm -rf "$tmp"
      die "build of $name failed"
    fi
    rm -rf "$dir"
    mv "$tmp" "$dir"
    log "built $name in $(( $(date +%s) - start )) s"
  fi
  exec 9>&-
}

if [ "${1:-}" = "--print" ]; then
  shift
  [ $# -gt 0 ] || die "--print needs a NAME"
  for name in "$@"; do
    bin=$(path_of "$name")
    [ -x "$bin" ] || { log "$name is not built: bash scripts/clients.sh $name"; exit 1; }
    echo "$bin"
  done
  exit 0
fi

[ $# -gt 0 ] || set -- $CLIENTS
for name in "$@"; do
  build "$name"
  echo "$name $(path_of "$name")"
done
