# syntax=docker/dockerfile:1
# Image of the `tollgate` command (the controller: `tollgate controller ...`).
#
# Not built on the development machine (it has no Docker), so it is kept small
# and plain. Build from the repository root, which .dockerignore trims to the
# Cargo workspace:
#   docker build -f docker/controller.Dockerfile -t ghcr.io/tollgate-dev/tollgate:dev .
FROM rust:1-slim AS build
WORKDIR /src
COPY . .
# rustls with ring: no OpenSSL, nothing to install beyond the image's C toolchain.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tollgate \
    && cp target/release/tollgate /tollgate

# glibc and libgcc, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /tollgate /usr/local/bin/tollgate
# distroless' nonroot user, by number so that runAsNonRoot can verify it.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["controller"]
