# syntax=docker/dockerfile:1
# Image of `tollgate-proxy`, the data plane the controller provisions per Gateway.
#
# Not built on the development machine (it has no Docker), so it is kept small
# and plain. Build from the repository root, which .dockerignore trims to the
# Cargo workspace:
#   docker build -f docker/proxy.Dockerfile -t ghcr.io/tollgate-dev/tollgate-proxy:dev .
FROM rust:1-slim AS build
WORKDIR /src
COPY . .
# rustls with ring: no OpenSSL, nothing to install beyond the image's C toolchain.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tollgate-proxy \
    && cp target/release/tollgate-proxy /tollgate-proxy

# glibc and libgcc, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /tollgate-proxy /usr/local/bin/tollgate-proxy
# distroless' nonroot user, by number so that runAsNonRoot can verify it. Ports
# below 1024 need the pod sysctl net.ipv4.ip_unprivileged_port_start, which the
# controller sets on provisioned proxies that listen on them.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tollgate-proxy"]
