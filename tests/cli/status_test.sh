#!/usr/bin/env bash
# The status page in a real browser: headless Chromium loads the page of a
# running 2-worker job; the loss chart (read from the DOM) has as many points
# as steps done. /metrics parses as Prometheus text (tests/cli/prom_check.py),
# /api/status holds what `morph status` prints, a status port in use exits 2
# naming the port, and `morph view` serves a finished run's page. Bytes
# reduced: the per-step gauge and the counter are there and count the
# steps' all-reduce payload.
set -euo pipefail
MORPH=$1
here=$(dirname "$0")
source "$here/shell_util.sh"
make_work
command -v chromium > /dev/null || { echo "FAIL: chromium is missing (scripts/install-deps.sh)"; exit 1; }

# status_url LOG: waits (20 s at most) for "status page on URL" in LOG; prints URL.
status_url() {
  local u=""
  for _ in $(seq 1 400); do
    u=$(sed -n 's/.*status page.* on \(http:[^ ]*\).*/\1/p' "$1" | head -n 1)
    [[ -n "$u" ]] && break
    sleep 0.05
  done
  [[ -n "$u" ]] || { echo "FAIL: no status page in $1" >&2; cat "$1" >&2; return 1; }
  echo "$u"
}
committed() { curl -sf "${1}api/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["steps_committed"])'; }
# dom URL: the page's DOM after 3 s of (virtual) time.
dom() {
  timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$work/chrome" \
    --virtual-time-budget=3000 --dump-dom "$1" 2> "$work/chrome.log"
}
attr() { grep -o "$1=\"[0-9]*\"" | head -n 1 | sed 's/.*="\([0-9]*\)"/\1/'; }

# A long job, killed once checked. Stragglers are only reported: Chromium
# shares the 2 cores with the workers' sub-millisecond steps, and a worker
# it slows would be released (morph_workers 1) on a busy machine.
STEPS=1000000 mlp_job "$work/job.toml" live 1
"$MORPH" run "$work/job.toml" --workers 2 --out "$work/live" --set elastic.straggler_replan=false \
  > "$work/live.log" 2>&1 &
live=$!
url=$(status_url "$work/live.log")
port=$(manager_port "$work/live.log")
for _ in $(seq 1 200); do
  [[ $(committed "$url") -ge 5 ]] && break
  sleep 0.05
done
before=$(committed "$url")
page=$(dom "$url")
after=$(committed "$url")
points=$(attr data-points <<< "$page")
step=$(attr data-step <<< "$page")
[[ -n "$points" && "$points" -ge 5 ]] || { echo "FAIL: loss chart has '$points' points"; echo "$page" | head -50; exit 1; }
[[ "$points" == "$step" ]] || { echo "FAIL: loss chart has $points points, the page shows $step steps done"; exit 1; }
((before <= points && points <= after)) || { echo "FAIL: $points points, but $before..$after steps done"; exit 1; }
echo "page: $points points in the loss chart ($before..$after steps done while the page loaded)"

curl -sf "${url}metrics" > "$work/metrics.txt"
python3 "$here/prom_check.py" morph_steps_committed morph_loss morph_samples_per_second morph_workers \
  morph_generation morph_resizes_total morph_checkpoint_age_seconds morph_reduced_bytes_per_step \
  morph_reduced_bytes_total < "$work/metrics.txt"
grep -q '^morph_workers{job_name="live"} 2$' "$work/metrics.txt" || { echo "FAIL: workers"; cat "$work/metrics.txt"; exit 1; }
# prom VALUE-OF METRIC FILE: the sample's value.
prom() { sed -n "s/^$1{[^}]*} \(.*\)$/\1/p" "$2"; }
python3 - "$(prom morph_reduced_bytes_per_step "$work/metrics.txt")" "$(prom morph_reduced_bytes_total "$work/metrics.txt")" <<'PY'
import sys
step, total = float(sys.argv[1]), float(sys.argv[2])
# Each step reduces the MLP's gradient; the counter holds the latest step's.
assert step > 0 and total >= step, "bytes reduced: per step %r, total %r" % (step, total)
PY

MORPH_TOKEN=$(cat "$work/live/token") "$MORPH" status --join "127.0.0.1:$port" > "$work/status.json"
curl -sf "${url}api/status" > "$work/api.json"
python3 - "$work/status.json" "$work/api.json" <<'PY'
import json, sys
cli, api = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
missing = [k for k in cli if k not in api]
assert not missing, "api/status lacks %s" % missing
assert api["members"] == cli["members"] and api["generation"] == cli["generation"], (api, cli)
PY

# A status port in use: exit 2 naming the port, before any worker starts.
busy=${url##*:}; busy=${busy%/}
set +e
"$MORPH" run "$work/job.toml" --workers 2 --status "127.0.0.1:$busy" --out "$work/busy" > "$work/busy.log" 2>&1
rc=$?
set -e
[[ $rc == 2 ]] || { echo "FAIL: a status port in use: exit $rc"; cat "$work/busy.log"; exit 1; }
grep -q "port $busy" "$work/busy.log" || { echo "FAIL: the message does not name port $busy"; cat "$work/busy.log"; exit 1; }
kill $live
wait $live 2> /dev/null || true

# morph view: a finished run's page, every step in the chart.
STEPS=12 mlp_job "$work/done.toml" done 2 $'[eval]\nevery = 4'
"$MORPH" run "$work/done.toml" --quiet --status off --out "$work/done" > /dev/null
"$MORPH" view "$work/done" > "$work/view.log" 2>&1 &
view=$!
vurl=$(status_url "$work/view.log")
page=$(dom "$vurl")
[[ $(attr data-points <<< "$page") == 12 ]] || { echo "FAIL: view: loss chart has $(attr data-points <<< "$page") points, not 12"; exit 1; }
acc=$(grep -o 'id="acc-chart" data-points="[0-9]*"' <<< "$page" | attr data-points)
[[ "$acc" == 3 ]] || { echo "FAIL: view: accuracy chart has $acc points, not 3"; exit 1; }
curl -sf "${vurl}metrics" > "$work/view_metrics.txt"
grep -q '^morph_finished{job_name="done"} 1$' "$work/view_metrics.txt" || { echo "FAIL: view: not finished"; exit 1; }
# The counter is the sum of the run's per-step reduced_bytes.
python3 - "$work/done/metrics.jsonl" "$(prom morph_reduced_bytes_total "$work/view_metrics.txt")" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
want = sum(l["reduced_bytes"] for l in lines)
assert want > 0 and float(sys.argv[2]) == want, "view: morph_reduced_bytes_total %s, metrics.jsonl sums to %d" % (sys.argv[2], want)
PY
kill $view
set +e; "$MORPH" view "$work/nothing" > /dev/null 2>&1; rc=$?; set -e
[[ $rc == 2 ]] || { echo "FAIL: view of a missing run: exit $rc"; exit 1; }
echo "PASS: live page, /metrics, /api/status, port in use, morph view"
