#!/usr/bin/env bash
# Start the simulated fleet of policies/default.yaml and the gateway; Ctrl-C stops everything.
# Settings pass through from the environment (GATEWAY_ADMIN_TOKEN, DATABASE_URL, GATEWAY_POLICY…).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${VENV:-.venv}/bin/python"
export DATABASE_URL="${DATABASE_URL:-sqlite:///gateway.db}"
export GATEWAY_POLICY="${GATEWAY_POLICY:-policies/default.yaml}"
SPEED="${SIM_SPEED:-1}"
# The admin API and the console need a token: a fresh one for this run unless one is given.
export GATEWAY_ADMIN_TOKEN="${GATEWAY_ADMIN_TOKEN:-$("$PY" -c 'import secrets; print(secrets.token_urlsafe(18))')}"
mkdir -p run

pids=()
stop() {
    trap - EXIT INT TERM
    echo "stopping gateway and simulators"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
}
trap stop EXIT INT TERM

"$PY" -m gateway db upgrade
# Serve the file as it is now (a new version only if it changed), and apply later saves live.
"$PY" -m gateway policy apply "$GATEWAY_POLICY" -m "make run" --author "${USER:-make-run}" >/dev/null

# One simulator process per backend of the default policy: two GPUs, the 70B model's GPU backend,
# one ASIC card, one CIM part (profile:port:seed[:models]).
for sim in gpu:9101:1 gpu:9102:2 gpu:9111:5:llama-3.1-70b-instruct asic:9201:3 cim:9301:4; do
    IFS=: read -r profile port seed models <<<"$sim"
    "$PY" -m simulator --profile "$profile" --host 127.0.0.1 --port "$port" --seed "$seed" \
        --speed "$SPEED" ${models:+--models "$models"} $([ "$profile" = gpu ] && echo --engine vllm) \
        >"run/sim-$profile-$port.log" 2>&1 &
    pids+=($!)
done
for port in 9101 9102 9111 9201 9301; do
    for _ in $(seq 100); do
        if "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
done
echo "simulators up: gpu :9101 :9102, gpu-70b :9111, asic :9201, cim :9301 (logs in run/)"

# Precision checks before the CIM part may go live (docs/precision.md), as the gateway starts: the
# ASIC's passes, the CIM part's fails; both are stored for the weekly report and the gate.
for pool in asic cim; do
    "$PY" -m gateway precision check --pool "$pool" --suite suites/chat.jsonl \
        --out "run/precision-$pool.json" >"run/precision-$pool.log" 2>&1 &
    pids+=($!)
done
echo "precision checks of asic and cim running: run/precision-asic.json, run/precision-cim.json"

echo "console: http://${GATEWAY_HOST:-127.0.0.1}:${GATEWAY_PORT:-8080}/console/ (admin token: $GATEWAY_ADMIN_TOKEN)"
"$PY" -m gateway serve --host "${GATEWAY_HOST:-127.0.0.1}" --port "${GATEWAY_PORT:-8080}" --watch &
pids+=($!)
wait "${pids[-1]}"
