#!/bin/sh
# `make images`: build the worker and operator images from the repository root with Docker
# (when an engine answers) or buildah (no daemon; Debian's package, `make image-tools`).
#   BASE_IMAGE=...       base of both images (default: the Dockerfiles' python:3.11-slim-bookworm);
#                        with no registry, make one first: images/local-base.sh (make image-base)
#   TORCH_INDEX_URL=...  the worker's torch wheel index (default: download.pytorch.org's CPU index)
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST  passed to pip in the build where set
#   ENGINE=docker|buildah, VERSION (0.1.0), WORKER_TAG, OPERATOR_TAG, ONLY=worker|operator,
#   BUILD_FLAGS (more options for every build, e.g. --label k=v; word-split)
#   USER_PACKAGE_DIR=dir, USER_IMPORTS="mod ..."  the worker with your package (docs/custom-envs.md):
#                        the named build context user_package, installed under the image's pins
set -eu
cd "$(dirname "$0")/.."
VERSION=${VERSION:-0.1.0}
WORKER_TAG=${WORKER_TAG:-tianji-worker:$VERSION}
OPERATOR_TAG=${OPERATOR_TAG:-tianji-operator:$VERSION}
ENGINE=${ENGINE:-}
if [ -z "$ENGINE" ]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then ENGINE=docker
  elif command -v buildah >/dev/null 2>&1; then ENGINE=buildah
  else
    echo "images/build.sh: no Docker engine answers ('docker info' failed) and buildah is not installed;" >&2
    echo "  start Docker, or install buildah (Debian/Ubuntu: make image-tools)" >&2
    exit 1
  fi
fi
# chroot isolation: RUN steps need no cgroup setup (hybrid cgroup hosts and containers refuse crun's).
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
if [ -z "${BASE_IMAGE:-}" ]; then
  echo "images/build.sh: base image python:3.11-slim-bookworm from Docker Hub; with no registry reachable," \
       "make image-base and set BASE_IMAGE=localhost/tianji-base:bookworm-py3.11 (images/README.md)" >&2
fi

build() {  # NAME TAG [extra build args]
  name=$1 tag=$2; shift 2
  # shellcheck disable=SC2086  # BUILD_FLAGS is a list of options
  set -- "$@" ${BUILD_FLAGS:-}
  [ -z "${BASE_IMAGE:-}" ] || set -- "$@" --build-arg "BASE_IMAGE=$BASE_IMAGE"
  # pip in the build uses the host's index settings
  [ -z "${PIP_INDEX_URL:-}" ] || set -- "$@" --build-arg "PIP_INDEX_URL=$PIP_INDEX_URL"
  [ -z "${PIP_EXTRA_INDEX_URL:-}" ] || set -- "$@" --build-arg "PIP_EXTRA_INDEX_URL=$PIP_EXTRA_INDEX_URL"
  [ -z "${PIP_TRUSTED_HOST:-}" ] || set -- "$@" --build-arg "PIP_TRUSTED_HOST=$PIP_TRUSTED_HOST"
  echo "images/build.sh: $ENGINE: $tag from images/$name.Dockerfile" >&2
  case $ENGINE in
    # BuildKit reads images/NAME.Dockerfile.dockerignore by itself.
    docker) DOCKER_BUILDKIT=1 docker build -f "images/$name.Dockerfile" -t "$tag" "$@" . ;;
    buildah) buildah build --layers --ignorefile "images/$name.Dockerfile.dockerignore" \
               -f "images/$name.Dockerfile" -t "$tag" "$@" . ;;
    *) echo "images/build.sh: ENGINE must be docker or buildah, not '$ENGINE'" >&2; exit 2 ;;
  esac
}

ONLY=${ONLY:-all}
case $ONLY in all|operator) build operator "$OPERATOR_TAG" ;; esac
case $ONLY in all|worker)
  set --
  [ -z "${TORCH_INDEX_URL:-}" ] || set -- "$@" --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"
  [ -z "${USER_PACKAGE_DIR:-}" ] || set -- "$@" --build-context "user_package=$USER_PACKAGE_DIR" \
                                        --build-arg USER_PACKAGE=/src/user
  [ -z "${USER_IMPORTS:-}" ] || set -- "$@" --build-arg "USER_IMPORTS=$USER_IMPORTS"
  build worker "$WORKER_TAG" "$@" ;;
esac
