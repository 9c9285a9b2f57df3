import sys, time, json, numpy as np, openvino as ov
variant, xml = sys.argv[1], sys.argv[2]
props = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 2, "INFERENCE_PRECISION_HINT": "f32"}
core = ov.Core()
if variant == "nommap":
    core.set_property({"ENABLE_MMAP": False})
if variant == "nopin":
    props["ENABLE_CPU_PINNING"] = False
c = core.compile_model(xml, "CPU", props)
r = c.create_infer_request()
rng = np.random.default_rng(0)
feeds = {p.get_any_name(): (rng.integers(1, 30000, (1, 128)) if "input_ids" in p.get_any_name() else np.ones((1, 128)) if "attention" in p.get_any_name() else np.zeros((1, 128))).astype(p.get_element_type().to_dtype()) for p in c.inputs}
for _ in range(50): r.infer(feeds)
chunks = []
for _ in range(8):
    ts = []
    for _ in range(150):
        t = time.perf_counter(); r.infer(feeds); ts.append(time.perf_counter() - t)
    chunks.append(round(1e3 * float(np.median(ts)), 3))
print(json.dumps({"variant": variant, "chunks": chunks}))
