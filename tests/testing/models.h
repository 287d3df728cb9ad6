// Model configurations shared by tests.
#pragma once

#include "frontends/model_config.h"

namespace kiln::testing {

// llama-tiny with head dim 64 (4 query heads on 2 kv heads, d_model 256): a shape the flash
// attention kernels take at 64-token sequences, so select-flash-attention replaces every
// layer's attention.
inline ModelConfig FlashTinyConfig() {
  ModelConfig c = *PresetConfig("llama-tiny");
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.d_model = 256;
  c.seq_len = 64;
  return c;
}

}  // namespace kiln::testing
