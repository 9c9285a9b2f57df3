"""Sequential vs interleaved-burst timing: per-run p50s and speed-ups of three models, alternated."""
import json, sys, time
from compress.eval.latency import LatencyConfig, measure_latency
models = ["/work/runs/retention/teacher-sst2", "/work/runs/auto/sst2-1of16", "/work/runs/auto/mrpc-1of8"]
out = []
for rep in range(2):
    for bursts in (1, 6):
        cfg = LatencyConfig(batch=(1,), seq=(128,), repeats=30, warmup=5, peak=False, record=False, repeat_runs=5, bursts=bursts)
        t = time.monotonic(); rows = measure_latency(models, cfg)["rows"]
        rec = {"bursts": bursts, "rep": rep, "seconds": round(time.monotonic() - t, 1),
               "rows": [{"model": r["name"], "runs_p50_ms": [round(x, 3) for x in r["runs_p50_ms"]], "p50_ms": round(r["p50_ms"], 3),
                         "spread_pct": round(r["spread_pct"], 1), "speedup": round(r["speedup"], 2),
                         "speedup_min": round(r["speedup_min"], 2)} for r in rows]}
        print(json.dumps(rec), flush=True); out.append(rec)
json.dump(out, open(sys.argv[1], "w"), indent=1)
