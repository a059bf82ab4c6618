#!/usr/bin/env bash
# Real peers for the tests (issue 34 §1): kube-apiserver and etcd built from
# their Go modules through the Go module proxy, cached outside the clone so a
# fresh clone (CI) on the same machine reuses them.
#
#   scripts/peers.sh [NAME...]          build what is missing (default: all, in
#                                       the order below), then print "NAME PATH"
#   scripts/peers.sh --print NAME...    print each binary's path, build nothing;
#                                       exit 1 if one is neither cached nor overridden
#   scripts/peers.sh --list             every peer: name, version, path, status
#
# NAME is a name from the table below (kube-apiserver-1.34), the cache
# directory's name (kube-apiserver-1.34.4) or a kind (etcd: every etcd).
#
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/watchcache/peers/<kind>-<version>/<binary>.
# A peer counts as cached when its binary runs and reports the pinned version
# (`--version`, or `version` for etcdctl). Builds go to a temporary directory
# beside it, renamed into place only when the binary passed that check, so an
# interrupted build never leaves a half cache; a flock per peer keeps two runs
# from building the same one.
#
# Override: WATCHCACHE_<NAME>, upper case, '-' and '.' as '_'
# (WATCHCACHE_KUBE_APISERVER_1_34=/path/to/kube-apiserver) is used as is,
# for --print and instead of a build.
#
# Every go command runs under `nice -n 19`, with CGO_ENABLED=0 (static, as the
# upstream release builds), GOWORK=off and GOFLAGS=-mod=mod, in a wrapper
# module in a temporary directory. GOPATH/GOMODCACHE/GOCACHE stay the user's.
# GOTOOLCHAIN is local unless the release's go directive needs a newer Go,
# then the release's toolchain (the go command fetches it from the proxy).
set -euo pipefail

# --- Pinned versions: the one place to change them -------------------------
# The newest patch of each line the Go module proxy serves:
#   go list -m -versions k8s.io/kubernetes          (1.34 line; newest release)
#   go list -m -versions go.etcd.io/etcd/server/v3  (3.6 and 3.7 lines)
#   go list -m -versions go.etcd.io/etcd/v3         (benchmark: this root module
#     holds tools/benchmark; the proxy serves it up to v3.6.8, no 3.7)
# kind: kube-apiserver (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3,
# etcdmain.Main; grpc-proxy is its subcommand), etcdctl
# (go.etcd.io/etcd/etcdctl/v3), etcd-benchmark (go.etcd.io/etcd/v3/tools/benchmark).
#  name                 kind             version
PEERS="
   kube-apiserver-1.34  kube-apiserver   1.34.4
   etcd-3.6             etcd             3.6.16
   etcdctl-3.6          etcdctl          3.6.16
   etcd-3.7             etcd             3.7.3
   etcdctl-3.7          etcdctl          3.7.3
   etcd-benchmark-3.6   etcd-benchmark   3.6.8
   kube-apiserver-1.37  kube-apiserver   1.37.2
"
# ---------------------------------------------------------------------------

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/watchcache/peers"

log() { printf '%s peers: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

binary_of() {
  case "$1" in
    etcd-benchmark) echo benchmark ;;
    *) echo "$1" ;;
  esac
}

env_var_of() { # kube-apiserver-1.34 -> WATCHCACHE_KUBE_APISERVER_1_34
  local v
  v=$(printf '%s' "$1" | tr 'a-z.-' 'A-Z__')
  echo "WATCHCACHE_$v"
}

cache_path() { # kind version
  echo "$CACHE/$1-$2/$(binary_of "$1")"
}

# The binary runs and reports the pinned version.
check() { # kind version binary
  local kind=$1 version=$2 bin=$3 out
  [ -x "$bin" ] || return 1
  case "$kind" in
    kube-apiserver)
      out=$(timeout 60 "$bin" --version 2>&1) || return 1
      [ "$out" = "Kubernetes v$version" ] ;;
    etcd)
      out=$(timeout 60 "$bin" --version 2>&1) || return 1
      grep -qxF "etcd Version: $version" <<<"$out" || return 1
      timeout 60 "$bin" grpc-proxy start --help >/dev/null 2>&1 ;;
    etcdctl)
      out=$(timeout 60 "$bin" version 2>&1) || return 1
      grep -qxF "etcdctl version: $version" <<<"$out" ;;
    etcd-benchmark)
      # prints no version; the cache directory names it
      timeout 60 "$bin" --help 2>&1 | grep -q 'benchmark' ;;
    *) return 1 ;;
  esac
}

# --- Building ---------------------------------------------------------------

# Runs go in the wrapper module ($work) at the lowest priority.
gow() {
  (cd "$work" && nice -n 19 env CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=mod \
    GOTOOLCHAIN="$toolchain" go "$@")
}

# GOTOOLCHAIN for building module@version: local when this Go is new enough
# for its go directive, else its toolchain directive (or that go version).
pick_toolchain() { # module version
  local gomod need tc have
  read -r gomod need < <(cd "$work" && GOTOOLCHAIN=local GOWORK=off \
    go list -m -f '{{.GoMod}} {{.GoVersion}}' "$1@$2")
  have=$(GOTOOLCHAIN=local go env GOVERSION)
  have=${have#go}
  toolchain=local
  if [ -n "$need" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | tail -1)" != "$have" ]; then
    tc=$(awk '$1 == "toolchain" { print $2; exit }' "$gomod")
    if [ -n "$tc" ] && [ "$(printf '%s\n%s\n' "${tc#go}" "$need" | sort -V | tail -1)" = "${tc#go}" ]; then
      toolchain=$tc
    else
      [[ $need =~ ^[0-9]+\.[0-9]+$ ]] && need=$need.0
      toolchain=go$need
    fi
    log "$1@$2 needs go $need, this is go $have: GOTOOLCHAIN=$toolchain"
  fi
}

# kube-apiserver cannot be `go install`ed: k8s.io/kubernetes's go.mod replaces
# its staging modules (k8s.io/api, ...) with ./staging/src paths. The wrapper
# replaces each with its published version instead: v1.34.4 -> v0.34.4.
build_kube_apiserver() { # version out
  local v=v$1 out=$2 minor staging gomod date ldflags p
  minor=${1#*.}
  minor=${minor%%.*}
  staging=v0.${1#*.}
  gow mod init watchcache-peers/kube-apiserver >/dev/null 2>&1
  pick_toolchain k8s.io/kubernetes "$v"
  read -r gomod date < <(gow list -m -f '{{.GoMod}} {{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "k8s.io/kubernetes@$v")
  local -a edits=()
  for m in $(awk '{ sub(/^replace[ \t]+/, "") } $2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$gomod"); do
    edits+=("-replace=$m=$m@$staging")
  done
  [ "${#edits[@]}" -gt 0 ] || die "no staging replaces found in $gomod"
  gow mod edit "${edits[@]}"
  gow get "k8s.io/kubernetes/cmd/kube-apiserver@$v"
  # hack/lib/version.sh sets these in both packages (component-base/version/base.go).
  ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
  done
  gow build -trimpath -ldflags "$ldflags" -o "$out" k8s.io/kubernetes/cmd/kube-apiserver
}

# etcd's own main package sits in the root module go.etcd.io/etcd/v3, which the
# proxy no longer serves for these releases; its main.go is just this.
build_etcd() { # version out
  gow mod init watchcache-peers/etcd >/dev/null 2>&1
  cat >"$work/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  pick_toolchain go.etcd.io/etcd/server/v3 "v$1"
  gow get "go.etcd.io/etcd/server/v3/etcdmain@v$1"
  gow build -trimpath -ldflags "-s -w" -o "$2" .
}

# A module's main package through the wrapper (its go.mod has replaces too).
build_package() { # module package version out
  gow mod init "watchcache-peers/$(basename "$2")" >/dev/null 2>&1
  pick_toolchain "$1" "v$3"
  gow get "$2@v$3"
  gow build -trimpath -ldflags "-s -w" -o "$4" "$2"
}

build_etcdctl() { build_package go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdctl/v3 "$@"; }
build_etcd_benchmark() { build_package go.etcd.io/etcd/v3 go.etcd.io/etcd/v3/tools/benchmark "$@"; }

# Builds one peer unless cached; 0 when the cache holds it afterwards.
build_peer() { # name kind version
  local name=$1 kind=$2 version=$3 dir bin
  dir="$CACHE/$kind-$version"
  bin=$(cache_path "$kind" "$version")
  if check "$kind" "$version" "$bin"; then
    log "$name: cached, $bin"
    return 0
  fi
  mkdir -p "$CACHE"
  (
    exec 9>"$CACHE/.$kind-$version.lock"
    flock 9
    if check "$kind" "$version" "$bin"; then # another run built it meanwhile
      log "$name: cached, $bin"
      exit 0
    fi
    rm -rf "$CACHE/.tmp-$kind-$version".* # left by a killed build; the lock is ours
    tmp=$(mktemp -d "$CACHE/.tmp-$kind-$version.XXXXXX")
    work=$(mktemp -d "${TMPDIR:-/tmp}/watchcache-peer-$kind-$version.XXXXXX")
    trap 'rm -rf "$tmp" "$work"' EXIT
    toolchain=local
    log "$name: building $kind $version (wrapper module $work)"
    start=$(date +%s)
    "build_${kind//-/_}" "$version" "$tmp/$(binary_of "$kind")"
    secs=$(($(date +%s) - start))
    check "$kind" "$version" "$tmp/$(binary_of "$kind")" ||
      die "$name: the built binary fails its check (--version is not $version)"
    {
      echo "name=$name kind=$kind version=$version"
      echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) seconds=$secs"
      echo "go=$(cd "$work" && GOTOOLCHAIN=$toolchain go env GOVERSION) GOTOOLCHAIN=$toolchain"
    } >"$tmp/BUILD-INFO"
    chmod 755 "$tmp"
    rm -rf "$dir" # a directory that failed the check above
    mv -T "$tmp" "$dir"
    log "$name: built in ${secs}s, $(du -sh "$dir" | cut -f1), $bin"
  )
}

# --- Command line -------------------------------------------------------------

# The table's rows matching NAME (all rows without one), as "name kind version".
select_peers() {
  local arg found row name kind version
  if [ $# -eq 0 ]; then
    awk 'NF == 3' <<<"$PEERS"
    return
  fi
  for arg in "$@"; do
    found=0
    while read -r name kind version; do
      [ -n "$name" ] || continue
      if [ "$arg" = "$name" ] || [ "$arg" = "$kind-$version" ] || [ "$arg" = "$kind" ]; then
        echo "$name $kind $version"
        found=1
      fi
    done <<<"$PEERS"
    [ "$found" = 1 ] || die "unknown peer '$arg'; known: $(awk 'NF == 3 { printf "%s ", $1 }' <<<"$PEERS")"
  done
}

# The path to use: the override if set, else the cache path.
peer_path() { # name kind version
  local var
  var=$(env_var_of "$1")
  if [ -n "${!var:-}" ]; then echo "${!var}"; else cache_path "$2" "$3"; fi
}

mode=build
case "${1:-}" in
  --print) mode=print; shift ;;
  --list) mode=list; shift ;;
  -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
  -*) die "unknown option $1 (see --help)" ;;
esac

rows=$(select_peers "$@")
case "$mode" in
  print)
    [ $# -gt 0 ] || die "--print needs a NAME"
    rc=0
    while read -r name kind version; do
      path=$(peer_path "$name" "$kind" "$version")
      var=$(env_var_of "$name")
      if [ -n "${!var:-}" ] || check "$kind" "$version" "$path"; then
        echo "$path"
      else
        log "$name: not built; run scripts/peers.sh $name (or set $var)"
        rc=1
      fi
    done <<<"$rows"
    exit "$rc" ;;
  list)
    while read -r name kind version; do
      path=$(peer_path "$name" "$kind" "$version")
      var=$(env_var_of "$name")
      if [ -n "${!var:-}" ]; then status="override $var"
      elif check "$kind" "$version" "$path"; then status=cached
      else status=missing; fi
      printf '%-20s %-8s %-8s %s\n' "$name" "$version" "$status" "$path"
    done <<<"$rows"
    exit 0 ;;
esac

command -v go >/dev/null 2>&1 || die "go is not on PATH"
failed=()
while read -r name kind version; do
  var=$(env_var_of "$name")
  if [ -n "${!var:-}" ]; then
    log "$name: $var is set, not building"
    continue
  fi
  # not `build_peer || ...`: errexit would be off inside it
  set +e
  (set -e; build_peer "$name" "$kind" "$version")
  rc=$?
  set -e
  [ "$rc" -eq 0 ] || failed+=("$name")
done <<<"$rows"
while read -r name kind version; do
  printf '%s %s\n' "$name" "$(peer_path "$name" "$kind" "$version")"
done <<<"$rows"
[ "${#failed[@]}" -eq 0 ] || die "failed: ${failed[*]}"
