#!/usr/bin/env bash
# [limits] enforced by a real cgroup v2 (RESULTS §35).  Run from the repo root on the GPU machine (root in a
# container on cgroup v2), with wheels of supervise's dependencies for its Python 3.12 in $WHEELS:
#   pip download --only-binary=:all: --python-version 3.12 ... -d .vllm/limits-wh   (here), then carry it.
#   OUT=/some/dir bash tests/perf/gpu/limits_cgroup.sh
set -uo pipefail
WHEELS=${WHEELS:-.vllm/limits-wh}
OUT=${OUT:-/tmp/limits-out}
mkdir -p "$OUT"
say() { echo "=== $(date +%T) $*"; }
top=/sys/fs/cgroup
say "cgroup v2 here"
grep cgroup /proc/self/mounts; cat /proc/self/cgroup; uname -r
echo "controllers: $(cat $top/cgroup.controllers)"; echo "subtree_control: $(cat $top/cgroup.subtree_control)"
say "supervise venv"
python3 --version
python3 -m venv /tmp/sv && /tmp/sv/bin/pip install -q --no-index --find-links "$WHEELS" pytest pytest-xdist \
  pytest-timeout pydantic structlog tenacity psutil asyncssh nvidia-ml-py google-re2 aiohttp httpx apprise \
  prometheus-client rich || exit 1
# The attempts' cgroups go under a delegated cgroup without processes (the setting cgroup_root).  The container's
# own cgroup holds its processes, and cgroup v2 enables no controller below a cgroup with processes: they move to
# a leaf first, as a container's init does for nested containers.
if ! grep -qw memory $top/cgroup.subtree_control; then
  mkdir -p $top/sv-init
  for p in $(cat $top/cgroup.procs); do echo "$p" > $top/sv-init/cgroup.procs 2>/dev/null; done
  echo "+memory +pids +cpu" > $top/cgroup.subtree_control || echo "could not enable the controllers"
fi
echo "subtree_control now: $(cat $top/cgroup.subtree_control)"
mkdir -p $top/sv-jobs
export SUPERVISE_CGROUP_ROOT=$top/sv-jobs
say "tests"
PYTHONPATH=$PWD /tmp/sv/bin/python -m pytest -n 0 -q -rs -s -p no:cacheprovider \
  tests/test_limits_e2e.py tests/test_limits.py 2>&1 | tee "$OUT/limits-tests.txt"
say "done"
