# syntax=docker/dockerfile:1
# TianJi operator image: `python -m tianji_operator` (Kopf), no torch.
#   docker build -f images/operator.Dockerfile -t tianji-operator:0.1.0 .
# The operator only plans and writes manifests: it imports the spec, planner and CRD
# modules of `tianji`, not its training runtime, so the package goes in with --no-deps
# and only images/operator-requirements.txt (pinned by images/constraints.txt) beside it.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

FROM base AS build
# The host's index settings, passed by images/build.sh where set (unset ARGs stay out of the env).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY images/constraints.txt images/operator-requirements.txt /tmp/
RUN --mount=type=cache,target=/root/.cache/pip pip install -c /tmp/constraints.txt -r /tmp/operator-requirements.txt
COPY pyproject.toml README.md /src/
COPY worker /src/worker
COPY operator /src/operator
RUN --mount=type=cache,target=/root/.cache/pip pip install --no-deps /src \
    && python -c "import tianji_operator.__main__, tianji_operator.handlers" \
    && python -m compileall -q /opt/venv

FROM base AS runtime
LABEL org.opencontainers.image.title="tianji-operator" \
      org.opencontainers.image.description="Kubernetes operator for TianJiJob (Kopf)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 tianji \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/tianji --create-home --shell /usr/sbin/nologin tianji
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp
USER 10001:10001
WORKDIR /home/tianji
# 8080: the operator's /metrics; 8081: Kopf's liveness /healthz.
EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "tianji_operator"]
