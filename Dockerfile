# syntax=docker/dockerfile:1
# order-timeout container images, from one build of the Cargo workspace:
#   docker build -t order-timeout .                        # production: `order-timeout` only
#   docker build --target tools -t order-timeout-tools .   # demo, bench, reference inventory
#   docker run --rm order-timeout --help
# The production image carries the service binary alone: no load generator, plotting,
# fonts or reference inventory server (those are the tools crate's).
# Needs BuildKit (the default since Docker 23) for the cargo cache mounts.

# ---- build ------------------------------------------------------------------------------
FROM rust:1.95-bookworm AS builder
WORKDIR /src

# build.rs compiles proto/ with protox (pure Rust): no system protoc needed.
# sqlx::migrate! embeds migrations/ at compile time. The root package is the service;
# tools/ is the workspace's other member.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
COPY migrations ./migrations
COPY tools ./tools

# Cache mounts keep the crate registry and compiled dependencies between builds, so a
# source change only recompiles the workspace. target/ lives in the cache, so copy the
# binaries out.
#
# Two builds, not one: the service is built on its own, as `scripts/test.sh` lints it
# (`cargo clippy -p order-timeout --bins --lib`), so that nothing the tools crate asks of
# its dependencies (features unified across one build) can reach the shipped binary; the
# tools after, into their binary only. (The service has no feature of its own: what the
# tools use of it is the always-compiled `order_timeout::testing`.)
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p order-timeout --bin order-timeout \
    && install -m 0755 target/release/order-timeout /usr/local/bin/order-timeout \
    && cargo build --release --locked -p order-timeout-tools --bin order-timeout-tools \
    && install -m 0755 target/release/order-timeout-tools /usr/local/bin/order-timeout-tools

# ---- runtime base -----------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 order-timeout \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin order-timeout

# Inside a container, listen on all interfaces (the binaries default to 127.0.0.1): the
# container's own network is the boundary. Publish the port to the host's loopback
# (`-p 127.0.0.1:9464:9464`) or behind a NetworkPolicy (deploy/kubernetes/), never to
# the world: the console answers anyone who reaches it (docs/console.md, "Exposure").
# AMQP_URL, DATABASE_URL, INVENTORY_URL still default to local servers: set them.
ENV HTTP_ADDR=0.0.0.0:9464
USER 10001:10001

# ---- tools: demo, bench, reference inventory server and shop schema ---------------------
FROM runtime AS tools
COPY --from=builder /usr/local/bin/order-timeout-tools /usr/local/bin/order-timeout-tools
# The bench starts `order-timeout serve` children: it finds the binary beside itself.
COPY --from=builder /usr/local/bin/order-timeout /usr/local/bin/order-timeout
ENV INVENTORY_ADDR=0.0.0.0:50051
# 50051: gRPC of the reference inventory server.
EXPOSE 50051
ENTRYPOINT ["order-timeout-tools"]
CMD ["--help"]

# ---- production (the default target: last in the file) -------------------------------
FROM runtime AS service
COPY --from=builder /usr/local/bin/order-timeout /usr/local/bin/order-timeout
# 9464: metrics, health and the console (HTTP_ADDR); see the exposure note above.
EXPOSE 9464
ENTRYPOINT ["order-timeout"]
CMD ["serve"]
