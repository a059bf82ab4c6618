#!/usr/bin/env bash
# The Kubernetes API Go modules the project reads, fetched by module name from
# the Go module proxy (`go mod download`, into Go's own module cache, outside
# the clone) at one pinned release:
#   k8s.io/api                     its testdata/ (Kubernetes' own serialization
#                                  fixtures: HEAD and one directory per older
#                                  release) and its generated.proto files
#   k8s.io/apimachinery            meta/v1, runtime, ... generated.proto
#   k8s.io/apiextensions-apiserver the CustomResourceDefinition types
#   k8s.io/kube-aggregator         the APIService types
#
# Usage:
#   scripts/k8s-modules.sh testdata   print the k8s.io/api testdata directory
#   scripts/k8s-modules.sh dir MODULE print a module's directory (e.g. k8s.io/api)
#   scripts/k8s-modules.sh version    print the pinned module version
#
# K8S_API_MODULE_VERSION overrides the pin (a v0.X.Y of the k8s.io/* modules,
# matching Kubernetes v1.X.Y).
set -euo pipefail

# The newest Kubernetes release the Go module proxy serves: the protobuf
# schema (scripts/k8s-proto-descriptors.sh) and the fixtures come from it.
version=${K8S_API_MODULE_VERSION:-v0.37.2}

command -v go >/dev/null 2>&1 || {
  echo "k8s-modules: the go command is needed (Go 1.26 or newer; Debian: golang-go)" >&2
  exit 1
}

# module_dir MODULE: downloads MODULE@version once and prints its directory.
module_dir() {
  local json dir
  # GOFLAGS=-mod=mod: no go.mod around is needed or read.
  json=$(cd "${TMPDIR:-/tmp}" && GOFLAGS=-mod=mod go mod download -json "$1@$version") || {
    echo "k8s-modules: could not download $1@$version from the Go module proxy" >&2
    return 1
  }
  dir=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
  [ -n "$dir" ] && [ -d "$dir" ] || {
    echo "k8s-modules: no directory for $1@$version in: $json" >&2
    return 1
  }
  printf '%s\n' "$dir"
}

case "${1:-}" in
  testdata)
    d=$(module_dir k8s.io/api)
    [ -d "$d/testdata/HEAD" ] || { echo "k8s-modules: $d has no testdata/HEAD" >&2; exit 1; }
    printf '%s\n' "$d/testdata"
    ;;
  dir)
    [ -n "${2:-}" ] || { echo "usage: $0 dir MODULE" >&2; exit 2; }
    module_dir "$2"
    ;;
  version)
    printf '%s\n' "$version"
    ;;
  *)
    echo "usage: $0 testdata | dir MODULE | version" >&2
    exit 2
    ;;
esac
