# The two quick-start commands (README): `make run` and `make test`.
# The cargo workspace: the daemon (root package `watchcache`) and the load
# generator (bench/, package `watchcache-bench`); lint and test cover both.
.PHONY: run test setup lint build peers test-peers test-etcd-matrix chaos

setup:
	bash scripts/setup.sh

# Dev mode: a private etcd on free loopback ports, the example resources on 127.0.0.1:8080.
run: setup
	cargo run --bin watchcache -- --dev

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

# The whole suite: formatting, lints, unit and integration tests against a
# real etcd (and a real kube-apiserver, built once from its Go module and
# cached: README, "Peers"), of every crate of the workspace, in one cargo
# invocation.
test: lint test-peers
	cargo test --workspace --all-targets

# The peers the tests use (the others are for the benchmarks and `make peers`).
test-peers:
	bash scripts/peers.sh kube-apiserver-1.34 kube-apiserver-1.37
	bash scripts/peers.sh etcdctl-3.6 etcdctl-3.7
	bash scripts/clients.sh informer informer-latest etcdclient-3.6 etcdclient-3.7 porcupine

# Real kube-apiserver and etcd built from their Go modules, cached outside the
# clone (README, "Peers"); `scripts/peers.sh --print NAME` gives a binary's path.
peers:
	bash scripts/peers.sh

# The storage, cacher and gRPC-front integration tests against etcd 3.6 and
# 3.7 (built by scripts/peers.sh; `make test` runs them against 3.5).
test-etcd-matrix: setup
	bash scripts/peers.sh etcd-3.6 etcdctl-3.6 etcd-3.7 etcdctl-3.7
	for v in 3.6 3.7; do \
	  echo "== etcd $$v"; \
	  WATCHCACHE_ETCD_BIN=$$(bash scripts/peers.sh --print etcd-$$v) \
	  WATCHCACHE_ETCDCTL_BIN=$$(bash scripts/peers.sh --print etcdctl-$$v) \
	  cargo test --test storage --test cacher --test grpc --test etcd_clients || exit 1; \
	done

# CI's chaos runs (docs/RELIABILITY.md), 2 minutes each on a fixed seed, with
# the binaries `make test` built: against one etcd, then against a 3-member
# cluster with the member faults and a rolling upgrade onto etcd 3.6 and 3.7
# (built by scripts/peers.sh), then etcd clients (Rust and clientv3) through
# the gRPC front (`--front grpc`), against one etcd and against a 3-member
# cluster. A violation fails the target.
# An error ends with its violations, not a backtrace (CI shows the tail).
CHAOS_SEED ?= 1
chaos: export RUST_LIB_BACKTRACE = 0
chaos: setup
	bash scripts/peers.sh etcd-3.6 etcd-3.7
	target/debug/watchcache-bench chaos --duration 120s --seed $(CHAOS_SEED) \
	  --json target/chaos.json --no-progress
	target/debug/watchcache-bench chaos --etcd-members 3 --duration 120s --seed $(CHAOS_SEED) \
	  --etcd-upgrade $$(bash scripts/peers.sh --print etcd-3.6) \
	  --etcd-upgrade $$(bash scripts/peers.sh --print etcd-3.7) \
	  --json target/chaos-cluster.json --no-progress
	target/debug/watchcache-bench chaos --front grpc --duration 120s --seed $(CHAOS_SEED) \
	  --json target/chaos-grpc.json --no-progress
	target/debug/watchcache-bench chaos --front grpc --etcd-members 3 --duration 120s --seed $(CHAOS_SEED) \
	  --etcd-upgrade $$(bash scripts/peers.sh --print etcd-3.6) \
	  --etcd-upgrade $$(bash scripts/peers.sh --print etcd-3.7) \
	  --json target/chaos-grpc-cluster.json --no-progress
