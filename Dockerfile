# syntax=docker/dockerfile:1
# tokensel-server image: build on Debian 12 with the CUDA 13 toolkit, run on
# Debian 12 slim with only the runtime libraries. Why Debian and not the
# nvidia/cuda (Ubuntu) images: docs/deploy.md, "The container image".
#
#   docker build -t tokensel-server:0.1.0 \
#     --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#   docker run --rm --gpus all -v /run/tokensel:/run/tokensel -p 9464:9464 tokensel-server:0.1.0

ARG DEBIAN_IMAGE=debian:12-slim

# ---------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS build
ARG CUDA_VERSION=13-0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# CUDA 13 toolkit (nvcc, cudart static, CCCL/CUB) from NVIDIA's Debian 12
# repository; the minimal build meta package, not the multi-GB full toolkit.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSLo /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb \
 && rm /tmp/cuda-keyring.deb \
 && apt-get update \
 && apt-get install -y --no-install-recommends "cuda-minimal-build-${CUDA_VERSION}" \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH}
# The same Debian -dev packages as CI and every developer machine.
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN /tmp/install-deps.sh && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The `docker` preset: Release, server on, tests/benchmarks off, CUDA required.
RUN cmake --preset docker \
 && cmake --build --preset docker --target tokensel-server \
 && cmake --install build/docker --prefix /opt/tokensel --strip

# ---------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="tokensel-server" \
      org.opencontainers.image.description="Token selection (sort, gather, scatter, masks, THD seqlens) as a node-local gRPC service for training jobs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.documentation="docs/deploy.md" \
      org.opencontainers.image.base.name="docker.io/library/debian:12-slim"
# Runtime halves of the build's -dev packages. No CUDA user-space library:
# cudart is linked statically and libcuda.so.1 comes from the host driver,
# injected by the NVIDIA container toolkit (the variables below ask for it).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623 \
      libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 tokensel \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin tokensel \
 && install -d -o 10001 -g 10001 -m 0750 /run/tokensel
COPY --from=build /opt/tokensel/bin/tokensel-server /usr/local/bin/tokensel-server
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
USER 10001:10001
# 50051: gRPC over TCP (kubelet gRPC probes); 9464: /metrics.
EXPOSE 50051 9464
ENTRYPOINT ["/usr/local/bin/tokensel-server"]
# --insecure_tcp: 50051 is plaintext without a token because kubelet gRPC
# probes can send neither; restrict it with a NetworkPolicy (docs/deploy.md).
# For remote clients pass --tls_cert, --tls_key and --auth_token_file instead.
CMD ["--listen=unix:///run/tokensel/tokensel.sock", "--listen=0.0.0.0:50051", "--insecure_tcp=true", "--metrics_address=0.0.0.0:9464"]
