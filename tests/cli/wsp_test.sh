#!/usr/bin/env bash
# Wave Synchronous Parallel (docs/wsp.md, issue 28). Bad [sync] values exit
# 2 naming the key: staleness < 0, wave < 1, a wave whose sums exceed the
# exact format's 4096 terms, "wsp" with one virtual worker or a pipeline;
# the sync default keeps the hash of a job without [sync]. Then the runtime:
# D = 0, wave = 1 gives the sync hash on the same workers (MLP with
# momentum on 2 and 3 workers, a CNN with batch norm on 2); with a device
# 3x slower the VN shares are sized by speed (9 + 3 of 12 VNs, docs/wsp.md
# "VN shares by device speed") and D = 0, wave = 1 still gives the sync
# hash (the hash of sync with any shares); a replay whose
# shares differ from the log's exits 2 naming the log. With one worker
# emulated 6x slower and 2 VNs (1 + 1 whatever the speeds) and D = 2 the
# log's clock gap reaches 2 and never exceeds it, and --replay of that log
# (without the slowdown, so the timing differs) reproduces the run's hash. Faults (docs/wsp.md,
# "Checkpoints and lost workers"): D = 0, wave = 1 with checkpoints run 16
# steps, then --resume on another worker count gives the sync hash; a
# virtual worker killed mid-run (the tests' build, CRASHY) loses its shard:
# the job finishes, reports the checkpoint it restored and the clocks and
# pushes lost, and with D = 0 still gives the sync hash.
set -euo pipefail
MORPH=$1
CRASHY=$2
source "$(dirname "$0")/shell_util.sh"
make_work

# PART (third argument): "drift" runs the drift and replay check alone (its
# timing is under test: ctest runs it alone), "rest" the others (hashes and
# exit codes: they share the cores), "all" (default) both.
part=${3:-all}

# summary_wsp DIR: prints summary.json's wsp as "gap pushes pulls".
summary_wsp() {
  python3 -c 'import json,sys; w=json.load(open(sys.argv[1]+"/summary.json"))["wsp"]; print(w["max_clock_gap"], w["pushes"], w["pulls"])' "$1"
}

bad_values() {
mlp_job "$work/plain.toml" wsp 3
mlp_job "$work/sync.toml" wsp 3 $'[sync]\nmode = "sync"'
plain=$("$MORPH" run "$work/plain.toml" --quiet --workers 2 --out "$work/plain" | tail -n 1)
sync=$("$MORPH" run "$work/sync.toml" --quiet --workers 2 --out "$work/sync" | tail -n 1)
[[ "$plain" == "$sync" ]] || { echo "FAIL: mode = \"sync\" changed the hash ($plain vs $sync)"; exit 1; }

mlp_job "$work/neg.toml" wsp 3 $'[sync]\nmode = "wsp"\nstaleness = -1'
expect_bad "$work/neg.toml" "sync.staleness" "$work/neg.toml"
mlp_job "$work/wave0.toml" wsp 3 $'[sync]\nmode = "wsp"\nwave = 0'
expect_bad "$work/wave0.toml" "sync.wave" "$work/wave0.toml"
mlp_job "$work/wavebig.toml" wsp 3 $'[sync]\nmode = "wsp"\nwave = 1025'
expect_bad "$work/wavebig.toml" "sync.wave.*at most 1024" "$work/wavebig.toml"
mlp_job "$work/rule.toml" wsp 3 $'[sync]\nmode = "wsp"\nstale_update = "half"'
expect_bad "$work/rule.toml" "sync.stale_update" "$work/rule.toml"
mlp_job "$work/one.toml" wsp 3 $'[sync]\nmode = "wsp"\nstaleness = 1'
expect_bad "$work/one.toml" "sync.mode.*at least two virtual workers" "$work/one.toml"
set +e
"$MORPH" run "$work/one.toml" --quiet --workers 4 --stages 2 --out "$work/badout" > /dev/null 2> "$work/bad.err"
rc=$?
set -e
[[ $rc == 2 ]] && grep -q "sync.mode.*pipelines" "$work/bad.err" \
  || { echo "FAIL: wsp with a pipeline: exit $rc"; cat "$work/bad.err"; exit 1; }

# Memory (docs/wsp.md, "Memory and wave"): the pushes a shard may hold grow
# with sync.staleness, so a D whose pushes exceed a device's memory exits 2
# naming sync.staleness, the device and the largest D that fits; sync.wave
# does not change the need (the same figure for wave 1 and 2); D = 2 runs.
cat > "$work/devs.toml" <<'TOML'
[types.small]
memory_mib = 1024
[[devices]]
type = "small"
count = 2
TOML
wsp_mem() {  # wsp_mem D WAVE STEPS: exit code; stderr in $work/mem.err
  STEPS=$3 mlp_job "$work/mem.toml" wsp-mem 3 $'[sync]\nmode = "wsp"\nstaleness = '"$1"$'\nwave = '"$2"
  set +e
  timeout 30 "$MORPH" run "$work/mem.toml" --quiet --resources "$work/devs.toml" --out "$work/memout" \
    > /dev/null 2> "$work/mem.err"  # a run the check let through would take hours
  echo $?
  set -e
}
rc=$(wsp_mem 10000 1 1000000)
[[ $rc == 2 ]] && grep -q "key 'sync.staleness'.*worker slot 0 (type small.*expected at most [0-9]*, got 10000" "$work/mem.err" \
  || { echo "FAIL: D = 10000 on 1 GiB devices: exit $rc"; cat "$work/mem.err"; exit 1; }
need1=$(grep -o "needs about [0-9.]* [A-Za-z]*" "$work/mem.err")
rc=$(wsp_mem 10000 2 1000000)
need2=$(grep -o "needs about [0-9.]* [A-Za-z]*" "$work/mem.err")
[[ $rc == 2 && -n "$need1" && "$need1" == "$need2" ]] \
  || { echo "FAIL: wave 2 changed the WSP memory ($need1 / $need2, exit $rc)"; cat "$work/mem.err"; exit 1; }
rc=$(wsp_mem 2 1 6)
[[ $rc == 0 ]] || { echo "FAIL: D = 2 on 1 GiB devices: exit $rc"; cat "$work/mem.err"; exit 1; }
# Without a resources file, this machine's available memory (a lower bound).
STEPS=100000000 HIDDEN=4096 mlp_job "$work/big.toml" wsp-big 1 $'[sync]\nmode = "wsp"\nstaleness = 1000000'
set +e
timeout 30 "$MORPH" run "$work/big.toml" --quiet --workers 2 --out "$work/bigout" > /dev/null 2> "$work/big.err"
rc=$?
set -e
[[ $rc == 2 ]] && grep -q "key 'sync.staleness'.*this machine" "$work/big.err" \
  || { echo "FAIL: D = 10^6 of a 3M-parameter model on this machine: exit $rc"; cat "$work/big.err"; exit 1; }
echo "memory: $need1 with D = 10000 on 1 GiB devices (wave 1 and 2), refused; D = 2 ran"

}

sync_hashes() {
# --- the runtime ----------------------------------------------------------
for workers in 2 3; do
  elastic_mlp_job "$work/m.toml" wsp-mlp 4 24
  elastic_mlp_job "$work/m0.toml" wsp-mlp 4 24 $'[sync]\nmode = "wsp"\nstaleness = 0\nwave = 1'
  # No worker is meant to die here: a start-up slowed past the default 2 s
  # of heartbeats on a loaded host (one run of 2026-12-05) ran on 2.
  ref=$("$MORPH" run "$work/m.toml" --quiet --workers $workers --heartbeat-timeout 10 --out "$work/ms$workers" | tail -n 1)
  got=$("$MORPH" run "$work/m0.toml" --quiet --workers $workers --heartbeat-timeout 10 --out "$work/mw$workers" | tail -n 1)
  echo "mlp on $workers workers: sync $ref, wsp D=0 $got"
  ref2=$ref  # the sync hash of any worker count
  [[ "$ref" == "$got" ]] || { echo "FAIL: D = 0, wave = 1 differs from sync on $workers workers"; exit 1; }
  read -r gap pushes pulls < <(summary_wsp "$work/mw$workers")
  (( gap == 0 && pushes == 24 * workers && pulls == 24 * workers )) \
    || { echo "FAIL: summary wsp = $gap $pushes $pulls on $workers workers"; exit 1; }
  [[ $(wc -l < "$work/mw$workers/wsp_log.jsonl") == $(( 24 * workers + 1 )) ]] || { echo "FAIL: log lines"; exit 1; }  # + the shares
  # Each VW's timing by part, and shards of about equal values: the MLP's
  # first weight (most of its values) is split between the shards, each
  # within 4096 values (ShardPieces::kAlign) of total / W.
  python3 - "$work/mw$workers/summary.json" "$workers" <<'PY' || { echo "FAIL: wsp.vw_seconds, shard_values or push bytes"; exit 1; }
import json, sys
w, n = json.load(open(sys.argv[1]))["wsp"], int(sys.argv[2])
t, v = w["vw_seconds"], w["shard_values"]
print("shard values", v, "VW 0 seconds", t[0])
assert [x["vw"] for x in t] == list(range(n)), t
for x in t:
    assert x["compute"] > 0 and 0 < x["compute_cpu"] <= x["compute"] * 1.01 + 0.01, x
    assert all(x[k] >= 0 for k in ("minibatch", "push", "gate", "pull", "checkpoint")), x
assert len(v) == n and all(abs(x - sum(v) / n) <= 4096 for x in v), v
# 24 waves, each VW pushing every other shard its values (8 bytes each
# unpacked; plus a scale and maximum per piece and two counts), packed
# smaller on the wire (docs/wsp.md, "A push on the wire").
raw, sent = w["push_unpacked_bytes"], w["push_bytes"]
print("push bytes", sent, "of", raw, "unpacked")
assert 8 * 24 * (n - 1) * sum(v) < raw <= 8 * 24 * (n - 1) * (sum(v) + 64), (raw, v)
assert 0 < sent < raw, (sent, raw)
PY
done

# Speed-sized shares: a device 3x slower gets 3 of the 12 VNs; D = 0,
# wave = 1 is still the sync step (the servers divide by the global batch
# whatever the split). Sync with a plan file of those shares has the same
# hash (any shares do: PlannerCli.PlanFilesFromThePlannerAndUnevenSharesKeepTheHash),
# not run again here to keep this test short.
fast_and_slow 3.0 "$work/res3.toml"
ref=$ref2
got=$("$MORPH" run "$work/m0.toml" --quiet --resources "$work/res3.toml" --out "$work/mwr" | tail -n 1)
shares=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]+"/summary.json"))["vn_shares"])' "$work/mwr")
echo "mlp, a device 3x slower: sync $ref, wsp D=0 with shares $shares $got"
[[ "$shares" == "[9, 3]" ]] || { echo "FAIL: the WSP shares on a 3x slower device are $shares, not [9, 3]"; exit 1; }
head -n 1 "$work/mwr/wsp_log.jsonl" | grep -qF '{"vn_shares":[9,3]}' || { echo "FAIL: the log's shares record"; exit 1; }
[[ "$ref" == "$got" ]] || { echo "FAIL: D = 0, wave = 1 with shares 9+3 differs from sync"; exit 1; }
set +e
"$MORPH" run "$work/m0.toml" --quiet --workers 2 --replay "$work/mwr/wsp_log.jsonl" --out "$work/badout" > /dev/null 2> "$work/bad.err"
rc=$?
set -e
[[ $rc == 2 ]] && grep -q "wsp_log.jsonl: the run gave its virtual workers VN shares 9+3, this one gives 6+6" "$work/bad.err" \
  || { echo "FAIL: a replay of other shares: exit $rc"; cat "$work/bad.err"; exit 1; }

cat > "$work/cnn.toml" <<TOML
[job]
name = "wsp-cnn"
seed = 2
steps = 8
[data]
dataset = "synthetic"
train_size = 96
test_size = 16
[model]
name = "cnn"
channels = [4, 8]
fc = 16
[batch]
global = 16
virtual_nodes = 4
[optim]
lr = 0.05
momentum = 0.9
weight_decay = 0.001
TOML
ref=$("$MORPH" run "$work/cnn.toml" --quiet --workers 2 --out "$work/cs" | tail -n 1)
got=$("$MORPH" run "$work/cnn.toml" --quiet --workers 2 --out "$work/cw" --set sync.mode=wsp | tail -n 1)
echo "cnn on 2 workers: sync $ref, wsp D=0 $got"
[[ "$ref" == "$got" ]] || { echo "FAIL: the CNN (batch norm) with D = 0 differs from sync"; exit 1; }

}

drift() {
# Drift: worker 1 emulates a device 6x slower; D = 2, waves of 2 minibatches.
# Two VNs: the shares stay 1 + 1 whatever the speeds, so the VWs drift (and
# the replay on even devices runs the same minibatches).
fast_and_slow 6.0 "$work/res.toml"
cat > "$work/res1.toml" <<TOML
[types.fast]
memory_mib = 1024
[[devices]]
type = "fast"
count = 2
TOML
elastic_mlp_job "$work/d2.toml" wsp-d2 6 60 $'[sync]\nmode = "wsp"\nstaleness = 2\nwave = 2'
sed -i 's/^virtual_nodes = 12$/virtual_nodes = 2/' "$work/d2.toml"
h1=$("$MORPH" run "$work/d2.toml" --quiet --resources "$work/res.toml" --out "$work/d2" | tail -n 1)
python3 - "$work/d2/wsp_log.jsonl" <<'PY' || { echo "FAIL: the clock gap"; exit 1; }
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert recs[0] == {"vn_shares": [1, 1]}, recs[0]
recs = recs[1:]
gaps = [r["clock"] - min(r["versions"]) for r in recs]
assert all(g == r["gap"] for g, r in zip(gaps, recs)), "gap field"
print("pulls", len(recs), "largest gap", max(gaps), "pulls at gap 2:", sum(g == 2 for g in gaps))
sys.exit(0 if max(gaps) == 2 else 1)
PY
read -r gap pushes pulls < <(summary_wsp "$work/d2")
(( gap == 2 && pushes == 60 && pulls == 60 )) || { echo "FAIL: summary wsp = $gap $pushes $pulls"; exit 1; }
h2=$("$MORPH" run "$work/d2.toml" --quiet --resources "$work/res1.toml" --replay "$work/d2/wsp_log.jsonl" \
  --out "$work/d2r" | tail -n 1)
echo "D = 2 run: $h1, its replay: $h2"
[[ "$h1" == "$h2" ]] || { echo "FAIL: the replay differs"; exit 1; }
cmp "$work/d2/wsp_log.jsonl" "$work/d2r/wsp_log.jsonl" || { echo "FAIL: the replay's pulls differ"; exit 1; }
# A log of another mapping is refused before any work.
set +e
"$MORPH" run "$work/d2.toml" --quiet --workers 3 --replay "$work/d2/wsp_log.jsonl" --out "$work/badout" > /dev/null 2> "$work/bad.err"
rc=$?
set -e
[[ $rc == 2 ]] && grep -q "wsp_log.jsonl.*same mapping" "$work/bad.err" || { echo "FAIL: replay on 3 workers: exit $rc"; cat "$work/bad.err"; exit 1; }

}

faults() {
# --- checkpoints and a lost virtual worker --------------------------------
ck=$'[checkpoint]\nevery = 8\n[sync]\nmode = "wsp"\nstaleness = 0\nwave = 1'
elastic_mlp_job "$work/k.toml" wsp-k 4 24
elastic_mlp_job "$work/k0.toml" wsp-k 4 24 "$ck"
ref=$("$MORPH" run "$work/k.toml" --quiet --workers 2 --out "$work/ks" | tail -n 1)
"$MORPH" run "$work/k0.toml" --quiet --workers 3 --steps 16 --out "$work/kr" > /dev/null
ls "$work/kr/checkpoints" | grep -q "step-000000000016" || { echo "FAIL: no WSP checkpoint of step 16"; exit 1; }
got=$("$MORPH" run "$work/k0.toml" --workers 2 --out "$work/kr" --resume "$work/kr/checkpoints" | tail -n 1)
echo "D = 0 sync $ref, 16 steps on 3 workers then resumed on 2: $got"
[[ "$ref" == "$got" ]] || { echo "FAIL: a resumed WSP run (D = 0) differs from sync"; exit 1; }

# run_killed JOB OUT: JOB on 3 workers, worker 1 dying before its
# minibatch 13 (morph_crashy's fault seam); the job must finish (exit 0).
run_killed() {
  local rc=0
  MORPH_TEST_FAULT="compute@13:1:exit" timeout 120 "$CRASHY" run "$1" --workers 3 --out "$2" > "$2.log" 2>&1 || rc=$?
  (( rc == 0 )) || { echo "FAIL: $1 with worker 1 killed: exit $rc"; tail -n 30 "$2.log"; exit 1; }
}
# Worker 1 dies before its minibatch 13: the shards hold version 13 at
# most, rank 0 gathered version 8 (due at 8, 16, 24) on its pull of clock 8.
run_killed "$work/k0.toml" "$work/kf"
grep -q "test hook: worker 1 at 'compute@13'" "$work/kf.log" || { echo "FAIL: the kill did not strike"; cat "$work/kf.log"; exit 1; }
grep "WSP: generation 1 restores" "$work/kf.log"
grep -q "WSP: generation 1 restores the servers' state of .*step-000000000008 (clock 8, step 8); clocks 8\.\.1[23] lost" \
  "$work/kf.log" || { echo "FAIL: the restore line"; cat "$work/kf.log"; exit 1; }
python3 - "$work/kf/summary.json" <<'PY' || { echo "FAIL: the resize record"; cat "$work/kf/summary.json"; exit 1; }
import json, sys
s = json.load(open(sys.argv[1]))
r = s["resizes"]
assert len(r) == 1 and r[0]["cause"] == "failure" and r[0]["from"] == 3 and r[0]["to"] == 2, r
w = r[0]["wsp"]
print("resize:", w)
assert w["restored_clock"] == 8 and w["restored_step"] == 8 and w["checkpoint"].endswith("step-000000000008"), w
# Worker 1 pushed waves 0..12; with D = 0 the others 13 or 14.
assert w["lost_clocks"][0] == 8 and w["lost_clocks"][1] in (13, 14), w
assert w["pushed"][1] == 13 and 5 + 5 + 5 <= w["pushes_lost"] <= 5 + 6 + 6, w
assert s["workers"] == 2 and s["steps"] == 24, s
PY
got=$(tail -n 1 "$work/kf.log")
echo "D = 0 with worker 1 killed at minibatch 13: $got"
[[ "$ref" == "$got" ]] || { echo "FAIL: the faulted WSP run (D = 0) differs from sync"; exit 1; }

# D = 2, waves of 2: the same kill. Its log starts with the restore record;
# --replay on the survivors' count replays the last generation from that
# checkpoint and gives the faulted run's hash and log.
elastic_mlp_job "$work/k2.toml" wsp-k2 4 24 $'[checkpoint]\nevery = 8\n[sync]\nmode = "wsp"\nstaleness = 2\nwave = 2'
run_killed "$work/k2.toml" "$work/k2f"
grep "WSP: generation 1 restores" "$work/k2f.log" || { echo "FAIL: no restore line"; cat "$work/k2f.log"; exit 1; }
head -n 1 "$work/k2f/wsp_log.jsonl" | grep -q '"restored"' || { echo "FAIL: no restore record"; exit 1; }
h1=$(tail -n 1 "$work/k2f.log")
h2=$("$MORPH" run "$work/k2.toml" --quiet --workers 2 --replay "$work/k2f/wsp_log.jsonl" --out "$work/k2r" | tail -n 1)
echo "D = 2 with worker 1 killed: $h1, its replay: $h2"
[[ "$h1" == "$h2" ]] || { echo "FAIL: the faulted run's replay differs"; exit 1; }
cmp "$work/k2f/wsp_log.jsonl" "$work/k2r/wsp_log.jsonl" || { echo "FAIL: the replay's log differs"; exit 1; }
}

if [[ $part != drift ]]; then bad_values; sync_hashes; faults; fi
if [[ $part != rest ]]; then drift; fi
echo "wsp test ($part) passed"
