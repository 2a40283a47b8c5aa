#!/bin/bash
# specserve watch on the healthy demo server (docs/reliability.md section 7):
# serve ENGINE, a bench run for the baseline, two client threads as load, then a watch of
# DURATION seconds (30-s intervals). Usage: benchmarks/watch_soak.sh ENGINE OUT [DURATION]
set -u
ENGINE=$1; OUT=$2; DURATION=${3:-600}
B=.venv/bin
mkdir -p "$OUT"
$B/specserve repo --engine "$ENGINE" --out "$OUT/repo" --baseline > "$OUT/repo.log" 2>&1 || exit 3
$B/specserve serve --repo "$OUT/repo" --http-port 18741 --grpc-port 18742 --metrics-port 18743 \
    --log "$OUT/server.log" > "$OUT/serve.out" 2>&1 &
SPID=$!
trap 'kill $SPID 2>/dev/null; wait $SPID 2>/dev/null' EXIT
for _ in $(seq 1 300); do curl -sf 127.0.0.1:18741/v2/health/ready >/dev/null && break; sleep 1; done
$B/specserve bench --url 127.0.0.1:18742 --concurrency 1 --requests 8 --warmup 1 \
    --prompts builtin-code --max-tokens 64 --temperature 0 --out "$OUT/bench" > "$OUT/bench.log" 2>&1 || exit 4
$B/python - "$OUT" "$DURATION" <<'PY'
import json, sys
from tests.watch.test_watch_server import Load
from specserve.watch.run import WatchConfig, watch
out, duration = sys.argv[1], float(sys.argv[2])
cfg = WatchConfig(urls=("http://127.0.0.1:18743/metrics",), baseline=f"{out}/bench/summary.json",
                  interval_s=30.0, duration_s=duration)
events = []
with Load("127.0.0.1:18742", threads=2, max_tokens=64) as load:
    code = watch(cfg, events.append)
with open(f"{out}/events.jsonl", "w") as f:
    f.write("".join(json.dumps(e) + "\n" for e in events))
iv = [e for e in events if e["event"] == "interval"]
print(json.dumps({"exit_code": code, "intervals": len(iv),
                  "statuses": sorted({e["status"] for e in iv}),
                  "alarms": sum(e["event"] == "alarm" for e in events),
                  "unsettled": sum(e["event"] == "unsettled-read" for e in events),
                  "rate": [min(e["acceptance_rate"] for e in iv), max(e["acceptance_rate"] for e in iv)],
                  "tau": [min(e["tau"] for e in iv), max(e["tau"] for e in iv)],
                  "draft_tokens": [min(e["draft_tokens"] for e in iv), max(e["draft_tokens"] for e in iv),
                                   sum(e["draft_tokens"] for e in iv)],
                  "requests": load.done, "errors": load.errors}))
PY
