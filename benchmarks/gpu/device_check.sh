#!/usr/bin/env bash
# One command for a GPU machine lent for a few minutes (issue 46): installs this checkout
# when the Python in use does not import it (no network: --no-deps --no-build-isolation),
# then runs benchmarks/gpu/device_check.py: the plan, the machine, the cuda tests and the
# measurements, each row written under $OUT (default ./device_check_out) as it is measured.
#
#   benchmarks/gpu/device_check.sh [--quick] [--dry-run] [--parts a,b] [--deadline S]
#
# PYTHON picks the interpreter (default: python3, the image's). Without CUDA it is a dry
# run: the plan, the machine, and every GPU row "skipped: no CUDA" after its workload was
# built on the CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT="${OUT:-$PWD/device_check_out}"
export DEVICE_CHECK_T0="${DEVICE_CHECK_T0:-$(date +%s)}"  # the deadline counts the install
mkdir -p "$OUT"
PY="$("${PYTHON:-python3}" benchmarks/gpu/device_check_install.py "$OUT" | tail -n 1)"
exec "$PY" benchmarks/gpu/device_check.py "$@"
