#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# An elastic job over the embedded store served with TLS and mutual TLS
# (ebbflow-run with EBBFLOW_STORE_TLS_*; the workers reach it at
# tcp+tls://... with EBBFLOW_TLS_*), certificates made by the test: worker 1
# of 3 is SIGKILLed mid-training, the group shrinks to 2 and ends equal to
# the single-process run, every sample of every step trained exactly once.
# Exits 77 (skipped), saying why, without the openssl CLI.
# Usage: tls_job.sh EBBFLOW_RUN ELASTIC_TRAIN
set -euo pipefail
run=$(realpath "$1") train=$(realpath "$2") here=$(cd "$(dirname "$0")" && pwd)
. "$here/job_checks.sh"
if ! command -v openssl >/dev/null; then
  echo "skipped: the openssl CLI is not installed (Debian: apt-get install openssl)"
  exit 77
fi
work=$(mktemp -d /tmp/ebbflow-tls-job.XXXXXX)
cleanup() {
  local rc=$?
  if [[ $rc -eq 0 || $rc -eq 77 ]]; then rm -rf "$work"; else echo "kept $work"; fi
}
trap cleanup EXIT INT TERM
cd "$work"
bash "$here/tls/make_certs.sh" certs >/dev/null
steps=600
common=(--steps "$steps" --sample-us 150 --step-us 1500 --slowdowns 1,2)
export EBBFLOW_TOKEN=tls-job
export EBBFLOW_STORE_TLS_CERT=certs/server.pem EBBFLOW_STORE_TLS_KEY=certs/server.key
export EBBFLOW_STORE_TLS_CLIENT_CA=certs/ca.pem EBBFLOW_STORE_TLS_REQUIRE_CLIENT_CERT=1
export EBBFLOW_TLS_CA=certs/ca.pem EBBFLOW_TLS_CERT=certs/client.pem EBBFLOW_TLS_KEY=certs/client.key
# Each worker writes down the store address it was given, then trains.
cat >wrap <<'SH'
#!/usr/bin/env bash
echo "$EBBFLOW_STORE" >>"store-addresses"
exec "$@"
SH
chmod +x wrap
rc=0
timeout 120 env EBBFLOW_LOG=info "$run" -n 3 --elastic --event-clock training --kill 1.5:1 -- \
  ./wrap "$train" "${common[@]}" --params-out elastic.bin --trace . >job.log 2>&1 || rc=$?
if [[ $rc != 0 ]]; then
  echo "FAIL: the elastic job failed ($rc)"
  tail -40 job.log
  exit 1
fi
if grep -qv '^tcp+tls://' store-addresses; then
  echo "FAIL: a worker was given a store address that is not TLS: $(sort -u store-addresses)"
  exit 1
fi
echo "the workers' store: $(sort -u store-addresses)"
grep -qF "world changed (failure): 3 -> 2" job.log || {
  echo "FAIL: the group did not shrink from 3 to 2 workers"
  grep -F "world changed" job.log
  exit 1
}
grep -F "world changed (failure)" job.log | head -2
"$train" "${common[@]}" --reference --params-out ref.bin --trace . >ref.log 2>&1
check_job "$steps"
echo "PASS (an elastic job over the embedded store with mutual TLS)"
