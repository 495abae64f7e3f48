import sys, time, jax, numpy as np, specjax
from specjax.models.adapter import T5Decoding
from specjax.bench.inputs import read_lines, encode_inputs, MULTI30K_TEST
n = int(sys.argv[1]) if len(sys.argv) > 1 else 24
g = 5
t16, d32_, tok = specjax.load_default_pair(size="small", dtype="bfloat16")
_, d32, _ = specjax.load_default_pair(size="small", dtype="float32")
dm_new, p16 = t16.decoding_model()
print("new kv_dtype", dm_new.kv_dtype)
dm_old = T5Decoding(t16.config)
ids = encode_inputs(tok, read_lines(MULTI30K_TEST, n), "", 64)
lines = [np.array([r + [0] * (64 - len(r))], np.int32) for r in ids]
fns = {
 "spec old": lambda x: specjax.speculative_sample((dm_old, p16), d32, x, gamma=g, max_decode_length=64, temperature=0.0),
 "spec new": lambda x: specjax.speculative_sample((dm_new, p16), d32, x, gamma=g, max_decode_length=64, temperature=0.0),
 "base16 old": lambda x: specjax.temperature_sample((dm_old, p16), x, max_decode_length=64, temperature=0.0),
 "base16 new": lambda x: specjax.temperature_sample((dm_new, p16), x, max_decode_length=64, temperature=0.0),
}
best = {k: np.full(len(lines), np.inf) for k in fns}; outs = {k: [] for k in fns}
for k, f in fns.items(): jax.block_until_ready(f(lines[0]))
for r in range(3):
    for j, x in enumerate(lines):
        for k, f in fns.items():
            t0 = time.perf_counter(); res = jax.block_until_ready(f(x)); best[k][j] = min(best[k][j], time.perf_counter() - t0)
            if r == 0: outs[k].append(np.asarray(res.sequences))
for k in fns:
    print(f"{k:12} {best[k].sum()*1e3:8.1f} ms")
print("spec new/old speedup", best["spec old"].sum() / best["spec new"].sum())
print("base16 new/old speedup", best["base16 old"].sum() / best["base16 new"].sum())
print("spec same", sum(np.array_equal(a, b) for a, b in zip(outs["spec old"], outs["spec new"])), "base16 same",
      sum(np.array_equal(a, b) for a, b in zip(outs["base16 old"], outs["base16 new"])))
