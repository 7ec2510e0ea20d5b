#!/usr/bin/env bash
# Start the real fleet of policies/real.yaml (llama.cpp engines, the power exporter) and the
# gateway with the console; Ctrl-C stops everything. Settings pass through from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${VENV:-.venv}/bin/python"
export DATABASE_URL="${DATABASE_URL:-sqlite:///gateway-real.db}"
export GATEWAY_POLICY="${GATEWAY_POLICY:-policies/real.yaml}"
export GATEWAY_ADMIN_TOKEN="${GATEWAY_ADMIN_TOKEN:-$("$PY" -c 'import secrets; print(secrets.token_urlsafe(18))')}"
mkdir -p run/real

pids=()
stop() {
    trap - EXIT INT TERM
    echo "stopping the gateway and the real fleet"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
}
trap stop EXIT INT TERM

"$PY" -m gateway db upgrade
"$PY" -m gateway policy apply "$GATEWAY_POLICY" -m "make real" --author "${USER:-make-real}" >/dev/null

# The engines and the exporter; the fleet prints "real fleet ready" once every engine answers.
"$PY" -m realfleet.fleet --logs run/real >run/real/fleet.log 2>&1 &
pids+=($!)
until grep -q "real fleet ready" run/real/fleet.log 2>/dev/null; do
    kill -0 "${pids[0]}" 2>/dev/null || { cat run/real/fleet.log; exit 1; }
    sleep 0.2
done
grep -v "ready" run/real/fleet.log

# Precision checks of the int8 ASIC and the analog CIM part on the labelled suite, as the gateway
# starts: the ASIC's passes, the CIM part's fails; both are stored for the report and the gate.
for pool in asic cim; do
    "$PY" -m gateway precision check --pool "$pool" --suite suites/facts.jsonl \
        --out "run/real/precision-$pool.json" >"run/real/precision-$pool.log" 2>&1 &
    pids+=($!)
done
echo "precision checks of asic and cim running: run/real/precision-{asic,cim}.json"

echo "model: tinyfacts, embeddings: all-minilm-l6-v2"
echo "console: http://${GATEWAY_HOST:-127.0.0.1}:${GATEWAY_PORT:-8080}/console/ (admin token: $GATEWAY_ADMIN_TOKEN)"
"$PY" -m gateway serve --host "${GATEWAY_HOST:-127.0.0.1}" --port "${GATEWAY_PORT:-8080}" --watch &
pids+=($!)
wait "${pids[-1]}"
