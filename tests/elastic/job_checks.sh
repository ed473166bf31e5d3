# SPDX-License-Identifier: Apache-2.0
# Shell functions for the tests that run a whole elastic job
# (examples/elastic_train under ebbflow-run, srun, ...) and check it.
# Sourced by them, with `here` set to tests/elastic.
#   wait_formed LOG         waits (30 s at most) until the job logging to LOG
#                           formed its first generation; else fails the test
#   check_job STEPS [ARG..] in the current folder: the sample trace is
#                           exactly-once over STEPS steps (check_trace.py,
#                           with ARGs) and elastic.bin equals the
#                           single-process reference ref.bin within float
#                           rounding (compare_params.py); else fails the test
wait_formed() {
  local log=$1
  for _ in $(seq 600); do
    grep -q '(initial)' "$log" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "FAIL: the job did not form its first generation"
  tail -20 "$log"
  exit 1
}

check_job() {
  local steps=$1
  shift
  if ! python3 "$here/check_trace.py" . --steps "$steps" "$@"; then
    echo "FAIL: the sample trace is not exactly-once"
    exit 1
  fi
  python3 "$here/compare_params.py" elastic.bin ref.bin || exit 1
}
