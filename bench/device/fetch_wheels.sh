#!/usr/bin/env bash
# Fetch, on a machine with network, the wheels bench/device/run.sh installs on a GPU machine that has
# none: Python 3.12 x86-64 with torch, numpy, pyyaml, rich, msgpack, prometheus-client, tensorboard,
# matplotlib, cloudpickle, pandas and OpenCV already there, but not what is listed below. Versions
# are those of the project's venv (stable-baselines3: the peer run's). Into .whl/ (git-ignored),
# which the device run carries with the tree.
#   bench/device/fetch_wheels.sh [DEST]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${1:-$ROOT/.whl}
PIP=${PIP:-$ROOT/.venv/bin/pip}
# Requires-Dist of each, checked: gymnasium needs cloudpickle, typing-extensions, farama-notifications;
# pydantic needs annotated-types, pydantic-core, typing-extensions, typing-inspection; ale-py and pyzmq
# only numpy; stable-baselines3 gymnasium, numpy, torch, cloudpickle, pandas, matplotlib.
WHEELS=(
  gymnasium==1.4.0 farama-notifications==0.0.6 ale-py==0.12.1 pyzmq==27.3.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 stable-baselines3==2.9.2
)
mkdir -p "$DEST"
"$PIP" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$DEST" "${WHEELS[@]}"
du -sh "$DEST"
ls -1 "$DEST"
