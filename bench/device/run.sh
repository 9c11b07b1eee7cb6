#!/usr/bin/env bash
# The GPU device check in one command (bench/device/run.py says what it measures).
#   bench/device/run.sh [--out DIR] [--budget SECONDS]   # on a GPU machine, wheels in .whl/
#   bench/device/run.sh --dry-run                        # every step briefly on the CPU (the test suite)
# On the device, the wheels bench/device/fetch_wheels.sh fetched into .whl/ go to /tmp/site (no
# network there; the machine's own torch stays), and the tree runs uncopied from worker/ and
# operator/. PYTHON picks the interpreter (default python3). The whole run ends itself within
# 8.5 minutes (--budget S: S + 20 s): run.py keeps to --budget, and `timeout` catches what it does not.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3}
DRY=0
for a in "$@"; do [ "$a" = "--dry-run" ] && DRY=1; done
PP="$ROOT/worker:$ROOT/operator"
if [ "$DRY" = 0 ] && compgen -G ".whl/*.whl" >/dev/null; then
  t0=$(date +%s)
  if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl; then
    PP="/tmp/site:$PP"
    echo "device check: wheels installed into /tmp/site in $(( $(date +%s) - t0 ))s" >&2
  else
    echo "device check: installing .whl/*.whl failed; going on with what is installed" >&2
    PP="/tmp/site:$PP"
  fi
elif [ "$DRY" = 0 ]; then
  echo "device check: no .whl/*.whl (bench/device/fetch_wheels.sh fetches them); using what is installed" >&2
fi
export PYTHONPATH="$PP${PYTHONPATH:+:$PYTHONPATH}"
# The device run keeps to 8.5 minutes; a dry run on a loaded 2-core box may take longer (its steps
# are short, but starting Python processes there is slow).
LIMIT=500
prev=
for a in "$@"; do  # --budget S or --budget=S (argparse takes both)
  case "$a" in --budget=*) v=${a#--budget=}; LIMIT=$(( ${v%.*} + 20 )) ;; esac
  [ "$prev" = "--budget" ] && LIMIT=$(( ${a%.*} + 20 )); prev=$a
done
[ "$DRY" = 1 ] && LIMIT=1500
exec timeout -k 10 "$LIMIT" "$PYTHON" -m bench.device.run "$@"
