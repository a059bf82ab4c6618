# watchcache: multi-stage build (builder with protoc, slim non-root runtime).
# No Docker engine runs on this project's development machines, so the image
# is not built in CI; the test suite lints this file with hadolint.
FROM rust:1-slim-trixie AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler make \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
# A workspace member: cargo reads its manifest even to build the daemon alone.
COPY bench ./bench
COPY config ./config
RUN cargo build --release --locked --bin watchcache

FROM debian:trixie-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home watchcache
COPY --from=builder /src/target/release/watchcache /usr/local/bin/watchcache
COPY config/watchcache.toml /etc/watchcache/watchcache.toml
USER 10001
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s CMD ["curl", "-fsS", "http://127.0.0.1:8080/livez"]
ENTRYPOINT ["/usr/local/bin/watchcache"]
CMD ["--config", "/etc/watchcache/watchcache.toml", "--listen", "0.0.0.0:8080"]
