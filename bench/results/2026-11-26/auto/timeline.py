import sys, time, json, numpy as np, openvino as ov
xml = sys.argv[1]; seconds = float(sys.argv[2])
props = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2, "INFERENCE_PRECISION_HINT": "f32"}
c = ov.Core().compile_model(xml, "CPU", props); r = c.create_infer_request()
rng = np.random.default_rng(0)
feeds = {p.get_any_name(): (rng.integers(1, 30000, (1, 128)) if "input_ids" in p.get_any_name() else np.ones((1, 128)) if "attention" in p.get_any_name() else np.zeros((1, 128))).astype(p.get_element_type().to_dtype()) for p in c.inputs}
for _ in range(50): r.infer(feeds)
# also a pure-python spin to see whether the CPU itself slows (not OV): fixed work timed
def spin():
    t = time.perf_counter(); s = 0
    for i in range(20000): s += i
    return time.perf_counter() - t
start = time.perf_counter(); out = []
while time.perf_counter() - start < seconds:
    ts = []
    for _ in range(100):
        t = time.perf_counter(); r.infer(feeds); ts.append(time.perf_counter() - t)
    out.append((round(time.perf_counter() - start, 2), round(1e3 * float(np.median(ts)), 3), round(1e3 * spin(), 3)))
print(json.dumps(out))
