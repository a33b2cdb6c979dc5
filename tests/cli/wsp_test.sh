#!/usr/bin/env bash
# Wave Synchronous Parallel (docs/wsp.md, issue 28). Bad [sync] values exit
# 2 naming the key: staleness < 0, wave < 1, a wave whose sums exceed the
# exact format's 4096 terms, "wsp" with one virtual worker or a pipeline;
# the sync default keeps the hash of a job without [sync].
set -euo pipefail
MORPH=$1
source "$(dirname "$0")/shell_util.sh"
make_work

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
mlp_job "$work/one.toml" wsp 3 $'[sync]\nmode = "wsp"\nstaleness = 1'
expect_bad "$work/one.toml" "sync.mode.*at least two virtual workers" "$work/one.toml"
set +e
"$MORPH" run "$work/one.toml" --quiet --workers 4 --stages 2 --out "$work/badout" > /dev/null 2> "$work/bad.err"
rc=$?
set -e
[[ $rc == 2 ]] && grep -q "sync.mode.*pipelines" "$work/bad.err" \
  || { echo "FAIL: wsp with a pipeline: exit $rc"; cat "$work/bad.err"; exit 1; }

echo "wsp test passed"
