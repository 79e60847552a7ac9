#!/usr/bin/env bash
# `make demo`: the consortium of this directory end to end, as a deployment runs it —
#   1. the three banks' own tables (generated on first use by `consortium up`, from consortium.toml's [generate]),
#   2. `consortium up`: the key authority, the aggregator and the three banks as five processes over mutual TLS,
#      CKKS-encrypted uploads, a dealer-free key ceremony, 20 rounds of FedGL,
#   3. `predict`: every bank scores all of its customers with the final model (the three at once),
#   4. `audit`: the privacy audit of the run (its JSON report, which the board shows),
# then prints where the scores, the audit and the board are, and each step's seconds.
#
# A finished federation stays finished (its nodes keep their state and key shares), so every demo starts a new one:
# the nodes' state and the previous run directory are deleted; the generated tables, the certificates and the
# operator secrets under runs/demo-consortium/ are reused. FEDGL is the command that runs fedgl-secure.
set -euo pipefail
cd "$(dirname "$0")/.."
FEDGL=${FEDGL:-.venv/bin/fedgl-secure}
DEMO=runs/demo-consortium
RUN=$DEMO/run
started=$EPOCHREALTIME

seconds_since() { awk -v start="$1" -v now="$EPOCHREALTIME" 'BEGIN { printf "%.1f", now - start }'; }

step() {  # step NAME COMMAND...: runs the command and reports its wall time on a line benchmarks/demo_chain.py reads
  local name=$1 start=$EPOCHREALTIME
  shift
  "$@"
  echo "demo step: $name $(seconds_since "$start") s"
}

written_to() {  # the file or table a `predict` summary (its last line, JSON) says it wrote
  tail -n 1 | sed -n 's/.*"written_to": "\([^"]*\)".*/\1/p'
}

echo "demo: a new federation (deleting $DEMO/state and $RUN; reusing the bank tables, certificates and secrets)"
rm -rf "$DEMO/state" "$RUN"
step "consortium-up" $FEDGL consortium up services/consortium.toml --run-dir "$RUN"
# The banks score their customers at once, each its own process (as on its own machine): most of a predict is the
# start of Python, torch and the services' modules, which in a row would leave the second core idle.
banks=(bank-a bank-b bank-c)
outputs=$(mktemp -d)
trap 'rm -rf "$outputs"' EXIT
predicting=$EPOCHREALTIME
pids=()
for bank in "${banks[@]}"; do
  $FEDGL predict --config "services/$bank.toml" >"$outputs/$bank.json" 2>"$outputs/$bank.log" &
  pids+=($!)
done
scores=()
for index in "${!banks[@]}"; do
  bank=${banks[$index]}
  if ! wait "${pids[$index]}"; then
    cat "$outputs/$bank.log" >&2
    echo "demo: predict failed for $bank" >&2
    exit 1
  fi
  cat "$outputs/$bank.json"
  scores+=("$bank: $(written_to <"$outputs/$bank.json")")
done
echo "demo step: predict $(seconds_since "$predicting") s"
step "audit" $FEDGL audit "$RUN" --format json --output "$RUN/audit.json"

echo
echo "demo: done in $(seconds_since "$started") s"
echo "  scores: ${scores[0]}"
for line in "${scores[@]:1}"; do echo "          $line"; done
echo "          (bank-c's table is in its own database, runs/demo-consortium/bank-data/sqlite/bank-c/bank.sqlite)"
echo "  audit:  $RUN/audit.json (its verdict is printed above; the whole report is on the board's /audit page)"
echo "  board:  $FEDGL board $RUN   then open http://127.0.0.1:8750/"
