# syntax=docker/dockerfile:1
# gpuwatch agent image: the static-ish Rust binary on distroless (glibc + libgcc, no shell).
#   docker build -t ghcr.io/gpuwatch/gpuwatch:0.1.0 .
# NVML (libnvidia-ml.so.1) is not in the image: the NVIDIA container toolkit mounts the
# host driver's copy (runtimeClassName: nvidia, NVIDIA_DRIVER_CAPABILITIES=utility).

FROM docker.io/library/rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release -p gpuwatch --locked \
 && install -D -m 0755 target/release/gpuwatch /out/gpuwatch

FROM gcr.io/distroless/cc-debian12
LABEL org.opencontainers.image.title="gpuwatch" \
      org.opencontainers.image.description="Per-node GPU health agent for Kubernetes: NVIDIA XID/ECC/PCIe/NVLink/thermal faults to OTLP, node conditions and taints." \
      org.opencontainers.image.source="https://github.com/gpuwatch/gpuwatch" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/gpuwatch /usr/local/bin/gpuwatch
# UID 0 on purpose: reading /dev/kmsg with kernel.dmesg_restrict=1 needs CAP_SYSLOG in the
# effective set, which Kubernetes only gives to UID 0 (no ambient capabilities). The pod spec
# drops every other capability and makes the root filesystem read-only (deploy/README.md).
USER 0:0
ENTRYPOINT ["/usr/local/bin/gpuwatch"]
CMD ["run", "--config", "/etc/gpuwatch/gpuwatch.toml"]
