# syntax=docker/dockerfile:1
# The production gpuwatch agent image: release build on rust:1-bookworm, the binary alone on
# distroless cc-debian12 (glibc + libgcc, no shell). Only the `gpuwatch` binary: the demo
# (`gpuwatch-demo`) writes fake NVIDIA lines into a kernel log and is not shipped.
#
#   docker build \
#     --build-arg GPUWATCH_GIT_COMMIT="$(git rev-parse --short=12 HEAD)" \
#     --build-arg BASE_IMAGE=gcr.io/distroless/cc-debian12@sha256:<digest> \
#     -t ghcr.io/gpuwatch/gpuwatch:"$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)" .
#
# Pin both images by digest for a release (`crane digest IMAGE`, `skopeo inspect
# docker://IMAGE`, or `docker buildx imagetools inspect IMAGE` print it); the tags below are
# the defaults for a quick build. The build context has no .git (.dockerignore), so the
# commit for `gpuwatch --version` comes in as a build argument.
#
# NVML (libnvidia-ml.so.1) is not in the image: the NVIDIA container toolkit mounts the
# host driver's copy (NVIDIA_DRIVER_CAPABILITIES=utility). deploy/image/build.sh builds the
# same layout FROM scratch without a registry and smoke-tests it; deploy/README.md says how
# the two relate.
ARG BUILD_IMAGE=docker.io/library/rust:1-bookworm
ARG BASE_IMAGE=gcr.io/distroless/cc-debian12

FROM ${BUILD_IMAGE} AS build
ARG GPUWATCH_GIT_COMMIT=unknown
ENV GPUWATCH_GIT_COMMIT=${GPUWATCH_GIT_COMMIT}
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gpuwatch --bin gpuwatch \
 && install -D -m 0755 target/release/gpuwatch /out/gpuwatch \
 && strip --strip-debug /out/gpuwatch
# (The release profile's line tables are three quarters of the binary and never loaded;
# panics in the image still name the functions.)

FROM ${BASE_IMAGE}
ARG GPUWATCH_GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="gpuwatch" \
      org.opencontainers.image.description="Per-node GPU health agent for Kubernetes: NVIDIA XID/ECC/PCIe/NVLink/thermal faults to OTLP, node conditions and taints." \
      org.opencontainers.image.source="https://github.com/gpuwatch/gpuwatch" \
      org.opencontainers.image.revision="${GPUWATCH_GIT_COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/gpuwatch /usr/local/bin/gpuwatch
# UID 0 on purpose: reading /dev/kmsg with kernel.dmesg_restrict=1 needs CAP_SYSLOG in the
# effective set, which Kubernetes only gives to UID 0 (no ambient capabilities). The pod spec
# drops every other capability and makes the root filesystem read-only (deploy/README.md).
USER 0:0
ENTRYPOINT ["/usr/local/bin/gpuwatch"]
CMD ["run", "--config", "/etc/gpuwatch/gpuwatch.toml"]
