/* Fuzz target: config.json (shoal_model_config_parse), the architecture of
 * every model shoal loads. On success every dimension the forward pass
 * sizes buffers with must be consistent (model_config.h); memory is the
 * JSON tree's: at most 256 x the input (jansson spends about 100 bytes on a
 * two-byte array element such as "0,"). */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    struct shoal_model_config cfg;
    struct shoal_err err = {0};
    memset(&cfg, 0, sizeof cfg);
    fuzz_mem_begin();
    int rc = shoal_model_config_parse((const char *)data, n, "fuzz config.json", &cfg, &err);
    struct fuzz_mem m = fuzz_mem_end();
    fuzz_mem_check("model_config", "parse", m, n, 256 * n + 64 * FUZZ_KIB, 4 * n + 64 * FUZZ_KIB);
    if (rc != 0) {
        FUZZ_ASSERT(rc < 0 && err.msg[0], "status %d, message '%s'", rc, err.msg);
        return 0;
    }
    FUZZ_ASSERT(cfg.family != NULL, "no family");
    FUZZ_ASSERT(cfg.n_layer >= 1 && cfg.n_layer <= SHOAL_MAX_LAYERS, "n_layer %lld",
                (long long)cfg.n_layer);
    FUZZ_ASSERT(cfg.n_embd >= 1 && cfg.n_vocab >= 1, "n_embd %lld n_vocab %lld",
                (long long)cfg.n_embd, (long long)cfg.n_vocab);
    FUZZ_ASSERT(cfg.n_expert_used >= 1 && cfg.n_expert_used <= cfg.n_expert,
                "n_expert_used %lld of %lld", (long long)cfg.n_expert_used,
                (long long)cfg.n_expert);
    FUZZ_ASSERT(cfg.n_head >= 1 && cfg.n_head_kv >= 1 && cfg.n_head % cfg.n_head_kv == 0,
                "n_head %lld n_head_kv %lld", (long long)cfg.n_head, (long long)cfg.n_head_kv);
    /* attention splits rows into heads of head_dim and rotates pairs */
    FUZZ_ASSERT(cfg.head_dim >= 2 && cfg.head_dim % 2 == 0, "head_dim %lld",
                (long long)cfg.head_dim);
    FUZZ_ASSERT(cfg.rope_dim >= 0 && cfg.rope_dim <= cfg.head_dim && cfg.rope_dim % 2 == 0,
                "rope_dim %lld of head_dim %lld", (long long)cfg.rope_dim,
                (long long)cfg.head_dim);
    FUZZ_ASSERT(cfg.n_ff_exp >= 1 && cfg.n_ff >= 0 && cfg.n_ff_shexp >= 0, "ffn widths");
    FUZZ_ASSERT(cfg.n_eos >= 0 && cfg.n_eos <= 8, "n_eos %d", cfg.n_eos);
    for (int64_t il = 0; il < cfg.n_layer; il++)
        FUZZ_ASSERT(cfg.layer_is_moe[il] || cfg.n_ff > 0, "dense layer %lld without n_ff",
                    (long long)il);
    return 0;
}
