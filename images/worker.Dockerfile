# syntax=docker/dockerfile:1
# TianJi worker image: every role pod runs `tianji worker ...` (the operator sets the command).
#   docker build -f images/worker.Dockerfile -t tianji-worker:0.1.0 .          (CPU torch)
# CUDA: torch's CUDA wheels bring their own CUDA libraries; the node's NVIDIA container
# toolkit brings the driver. Pick the CUDA wheel index, and optionally a CUDA base:
#   docker build -f images/worker.Dockerfile -t tianji-worker:0.1.0-cu128 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 .
# Both stages start from BASE_IMAGE, so the virtual environment's interpreter path matches;
# a base without Python (nvidia/cuda) gets the distribution's python3.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive
RUN if ! command -v python3 >/dev/null 2>&1; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi

FROM base AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY images/constraints.txt /tmp/constraints.txt
# torch first, from its own index (CPU by default), then everything else from PyPI, pinned.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md /src/
COPY worker /src/worker
COPY operator /src/operator
RUN pip install -c /tmp/constraints.txt /src \
    && python -c "import torch, gymnasium, zmq, tianji.runtime.worker, tianji.cli; print('torch', torch.__version__)" \
    && python -m compileall -q /opt/venv

FROM base AS runtime
LABEL org.opencontainers.image.title="tianji-worker" \
      org.opencontainers.image.description="TianJi deep-RL worker (actor, buffer, learner roles)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tianji \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/tianji --create-home --shell /usr/sbin/nologin tianji \
    && mkdir -p /var/lib/tianji && chown 10001:10001 /var/lib/tianji
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/tianji \
    MPLCONFIGDIR=/tmp/matplotlib \
    TIANJI_STATE_DIR=/var/lib/tianji
USER 10001:10001
WORKDIR /home/tianji
EXPOSE 9090
ENTRYPOINT ["tianji"]
CMD ["--help"]
