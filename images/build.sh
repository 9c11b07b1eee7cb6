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
case $ENGINE in docker|buildah) ;;
  *) echo "images/build.sh: ENGINE must be docker or buildah, not '$ENGINE'" >&2; exit 2 ;;
esac
# chroot isolation: RUN steps need no cgroup setup (hybrid cgroup hosts and containers refuse crun's).
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
ONLY=${ONLY:-all}

# The base: BASE_IMAGE, else the Dockerfiles' python:3.11-slim-bookworm where it is here or can be
# pulled, else the one `make image-base` makes from Debian's packages (made now if need be, buildah).
DEFAULT_BASE=python:3.11-slim-bookworm
LOCAL_BASE=localhost/tianji-base:bookworm-py3.11
have_image() {
  case $ENGINE in docker) docker image inspect "$1" ;; buildah) buildah inspect --type image "$1" ;; esac >/dev/null 2>&1
}
if [ -n "${BASE_IMAGE:-}" ]; then
  echo "images/build.sh: base image $BASE_IMAGE (BASE_IMAGE)" >&2
elif have_image "$DEFAULT_BASE" || "$ENGINE" pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then
  echo "images/build.sh: base image $DEFAULT_BASE (Docker Hub)" >&2
elif have_image "$LOCAL_BASE"; then
  BASE_IMAGE=$LOCAL_BASE
  echo "images/build.sh: base image $LOCAL_BASE (Docker Hub unreachable; made earlier by make image-base)" >&2
elif [ "$ENGINE" = buildah ] && echo "images/build.sh: Docker Hub unreachable: making $LOCAL_BASE" \
       "from Debian's packages (make image-base)" >&2 && images/local-base.sh "$LOCAL_BASE"; then
  BASE_IMAGE=$LOCAL_BASE
  echo "images/build.sh: base image $LOCAL_BASE (Docker Hub unreachable; made now by make image-base)" >&2
else
  echo "images/build.sh: no base image: $DEFAULT_BASE cannot be pulled and $LOCAL_BASE cannot be made" \
       "(make image-base: root, buildah and debootstrap); set BASE_IMAGE (images/README.md)" >&2
  exit 1
fi

# The worker's torch wheels: TORCH_INDEX_URL, else PyTorch's CPU index where it answers, else the
# pip index this machine is configured with (PyPI's torch is the CUDA build: gigabytes more).
DEFAULT_TORCH_INDEX=https://download.pytorch.org/whl/cpu
answers() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=15)' "$1" \
              >/dev/null 2>&1; }
case $ONLY in all|worker)
  if [ -n "${TORCH_INDEX_URL:-}" ]; then
    echo "images/build.sh: torch from $TORCH_INDEX_URL (TORCH_INDEX_URL)" >&2
  elif answers "$DEFAULT_TORCH_INDEX/torch/"; then
    echo "images/build.sh: torch from $DEFAULT_TORCH_INDEX (PyTorch's CPU index)" >&2
  else
    TORCH_INDEX_URL=${PIP_INDEX_URL:-$(python3 -m pip config get global.index-url 2>/dev/null || true)}
    TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://pypi.org/simple}
    echo "images/build.sh: torch from $TORCH_INDEX_URL (PyTorch's CPU index unreachable; the configured pip" \
         "index, whose torch may be the larger CUDA build)" >&2
  fi ;;
esac

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
  esac
}

case $ONLY in all|operator) build operator "$OPERATOR_TAG" ;; esac
case $ONLY in all|worker)
  set --
  [ -z "${TORCH_INDEX_URL:-}" ] || set -- "$@" --build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"
  [ -z "${USER_PACKAGE_DIR:-}" ] || set -- "$@" --build-context "user_package=$USER_PACKAGE_DIR" \
                                        --build-arg USER_PACKAGE=/src/user
  [ -z "${USER_IMPORTS:-}" ] || set -- "$@" --build-arg "USER_IMPORTS=$USER_IMPORTS"
  build worker "$WORKER_TAG" "$@" ;;
esac
