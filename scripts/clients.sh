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
# NAME: informer (tests/clients/go/informer, k8s.io/client-go).
# NAME: etcdclient-3.6, etcdclient-3.7 (tests/clients/go/etcdclient, etcd's
#   clientv3: go.mod holds v3.6, go.37.mod/go.37.sum v3.7, `go build -modfile`);
#   cached as etcdclient-<clientv3 version>-<sha of main.go + that go.sum>.
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/watchcache/clients/
#   <name>-<client-go version>-<sha256 of main.go + go.sum, 12 hex>/<name>
# so a change to the program or its dependencies builds a new binary. A build
# goes to a temporary directory beside it, renamed into place when done; a
# flock keeps two runs from building the same one. Go runs under `nice -n 10`
# with CGO_ENABLED=0, GOWORK=off, GOFLAGS=-mod=readonly (go.sum is committed).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/watchcache/clients"
CLIENTS="informer"
CLIENTS="$CLIENTS etcdclient-3.6 etcdclient-3.7"

log() { printf '%s clients: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

src_of() { echo "$ROOT/tests/clients/go/$1"; }

# etcdclient-3.6 / -3.7: the modfile of that clientv3 version.
etcd_modfile_of() {
  case $1 in
    etcdclient-3.6) echo go.mod ;;
    etcdclient-3.7) echo go.37.mod ;;
    *) die "unknown client: $1" ;;
  esac
}

etcd_path_of() { # etcdclient-X.Y -> cached binary path
  local src mod version sha
  src=$(src_of etcdclient)
  mod=$(etcd_modfile_of "$1")
  version=$(awk '$1 == "go.etcd.io/etcd/client/v3" { print $2; exit }' "$src/$mod")
  [ -n "$version" ] || die "$1: no go.etcd.io/etcd/client/v3 in $mod"
  sha=$(cat "$src/main.go" "$src/${mod%.mod}.sum" | sha256sum | cut -c1-12)
  echo "$CACHE/etcdclient-$version-$sha/etcdclient"
}

etcd_build() { # etcdclient-X.Y, as build() with that version's modfile
  local name=$1 src mod bin dir tmp start
  src=$(src_of etcdclient)
  mod=$(etcd_modfile_of "$name")
  bin=$(etcd_path_of "$name")
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
          nice -n 10 go build -modfile="$mod" -trimpath -o "$tmp/etcdclient" .); then
      rm -rf "$tmp"
      die "build of $name failed"
    fi
    rm -rf "$dir"
    mv "$tmp" "$dir"
    log "built $name in $(( $(date +%s) - start )) s"
  fi
  exec 9>&-
}

path_of() { # name -> cached binary path
  local src version sha
  case $1 in etcdclient-*) etcd_path_of "$1"; return ;; esac
  src=$(src_of "$1")
  [ -f "$src/go.mod" ] || die "unknown client: $1"
  version=$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$src/go.mod")
  [ -n "$version" ] || die "$1: no k8s.io/client-go in go.mod"
  sha=$(cat "$src/main.go" "$src/go.sum" | sha256sum | cut -c1-12)
  echo "$CACHE/$1-$version-$sha/$1"
}

build() { # name
  local name=$1 src bin dir tmp start
  case $name in etcdclient-*) etcd_build "$name"; return ;; esac
  src=$(src_of "$name")
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
          nice -n 10 go build -trimpath -o "$tmp/$name" .); then
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
