# syntax=docker/dockerfile:1
# order-timeout container image: one binary, subcommands serve | migrate | inventory-server | ...
#   docker build -t order-timeout .
#   docker run --rm order-timeout --help
# Needs BuildKit (the default since Docker 23) for the cargo cache mounts.

# ---- build ------------------------------------------------------------------------------
FROM rust:1.95-bookworm AS builder
WORKDIR /src

# build.rs compiles proto/ with protox (pure Rust): no system protoc needed.
# sqlx::migrate! embeds migrations/ at compile time.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY migrations ./migrations
COPY src ./src

# Cache mounts keep the crate registry and compiled dependencies between builds, so a
# source change only recompiles this crate. target/ lives in the cache, so copy the binary out.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin order-timeout \
    && install -m 0755 target/release/order-timeout /usr/local/bin/order-timeout

# ---- runtime ----------------------------------------------------------------------------
FROM debian:bookworm-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 order-timeout \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin order-timeout

COPY --from=builder /usr/local/bin/order-timeout /usr/local/bin/order-timeout

# Inside a container, listen on all interfaces (the binary defaults to 127.0.0.1).
# AMQP_URL, DATABASE_URL, INVENTORY_URL still default to local servers: set them.
ENV HTTP_ADDR=0.0.0.0:9464 \
    INVENTORY_ADDR=0.0.0.0:50051

USER 10001:10001
# 9464: metrics and health (HTTP_ADDR); 50051: gRPC of the reference inventory-server.
EXPOSE 9464 50051
ENTRYPOINT ["order-timeout"]
CMD ["serve"]
