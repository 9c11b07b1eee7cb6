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
# Your own envs and models (spec.env.imports, model.entryPoint; docs/custom-envs.md): USER_PACKAGE
# is what pip installs after TianJi, under the same constraints (it cannot move torch), either a
# requirement from an index or the source directory passed as the named context `user_package`:
#   docker build -f images/worker.Dockerfile -t registry.example.com/reach-goal-worker:0.1.0 \
#     --build-context user_package=examples/custom-env \
#     --build-arg USER_PACKAGE=/src/user --build-arg USER_IMPORTS="reach_goal reach_goal.models" .
# EXTRA_PIP adds pip options (e.g. --extra-index-url https://pypi.example.com/simple); USER_IMPORTS
# are imported once at build time, so a missing module fails the build, not the job.
ARG BASE_IMAGE=python:3.11-slim-bookworm

# Empty unless `--build-context user_package=<dir>` replaces it (BuildKit named contexts).
FROM scratch AS user_package

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive
RUN if ! command -v python3 >/dev/null 2>&1; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi

FROM base AS build
# The host's index settings, passed by images/build.sh where set (unset ARGs stay out of the env).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY images/constraints.txt /tmp/constraints.txt
# torch first, from its own index (CPU by default), then everything else from PyPI, pinned.
RUN --mount=type=cache,target=/root/.cache/pip pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
# Bytecode is compiled at build time (the root filesystem is read-only at run time). torch ships
# one 3.12-only test helper that 3.11 cannot parse and no worker imports: it alone is skipped,
# on every base, so the same command serves 3.11 and 3.12 (tests/images/test_image_build_inputs.py).
# pip caches in a build cache mount: a rebuild reuses the wheels (where the index lets pip cache
# them: images/README.md), and no layer keeps them.
COPY pyproject.toml README.md /src/
COPY worker /src/worker
COPY operator /src/operator
RUN --mount=type=cache,target=/root/.cache/pip pip install -c /tmp/constraints.txt /src \
    && python -c "import torch, gymnasium, zmq, tianji.runtime.worker, tianji.cli; print('torch', torch.__version__)" \
    && python -m compileall -q -x '/torch/testing/_internal/py312_intrinsics[.]py$' /opt/venv
ARG USER_PACKAGE=""
ARG EXTRA_PIP=""
ARG USER_IMPORTS=""
COPY --from=user_package / /src/user/
RUN --mount=type=cache,target=/root/.cache/pip if [ -n "${USER_PACKAGE}" ]; then \
      pip install -c /tmp/constraints.txt ${EXTRA_PIP} "${USER_PACKAGE}" \
      && python -c "import sys, importlib, torch, tianji.runtime.worker; [importlib.import_module(m) for m in sys.argv[1:]]" ${USER_IMPORTS} \
      && python -m compileall -q -x '/torch/testing/_internal/py312_intrinsics[.]py$' /opt/venv; \
    elif [ -n "${USER_IMPORTS}" ]; then echo "USER_IMPORTS without USER_PACKAGE" >&2; exit 1; \
    fi

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
