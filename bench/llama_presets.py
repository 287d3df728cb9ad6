"""kiln's llama presets (frontends/model_config.cc) as the Python benchmarks see them, without
torch: bench/torch_llama.py and bench/hf_generate.py build their models from these, and
bench/generate_h200.sh computes the decode step's bandwidth floor from them."""

PRESETS = {
    "llama-tiny": dict(vocab=256, d=128, layers=2, heads=4, kv=2, hd=32, ff=384, seq=64, batch=8),
    "llama-S": dict(vocab=32000, d=768, layers=16, heads=12, kv=4, hd=64, ff=2048, seq=1024, batch=16),
    "llama-M": dict(vocab=32000, d=2048, layers=16, heads=16, kv=8, hd=128, ff=5632, seq=2048, batch=4),
}
RMS_EPS, ROPE_THETA = 1e-5, 10000.0  # every preset's (ModelConfig's defaults)
