# The two quick-start commands (README): `make run` and `make test`.
.PHONY: run test setup lint build

setup:
	bash scripts/setup.sh

# Dev mode: a private etcd on free loopback ports, the example resources on 127.0.0.1:8080.
run: setup
	cargo run --bin watchcache -- --dev

lint: setup
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings

# The whole suite: formatting, lints, unit and integration tests against a real etcd.
test: lint
	cargo test --all-targets
