#include "quant_config.h"

#include <string.h>

#include "tensor.h"

/* a JSON value's kind for messages */
static const char *kind(const json_t *v)
{
    return json_is_string(v) ? json_string_value(v) : json_is_null(v) ? "null" : "a non-string";
}

/* optional string field key of q: absent/null is fine, else must be want */
static int want_str(json_t *q, const char *key, const char *want, const char *what,
                    struct shoal_err *err)
{
    json_t *v = json_object_get(q, key);
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), want))
        return 0;
    return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                         "%s: quantization_config.%s is '%s'; expected '%s'", what, key,
                         kind(v), want);
}

int shoal_quant_config_parse(json_t *root, const char *what, struct shoal_model_config *cfg,
                             struct shoal_err *err)
{
    cfg->fp8_block = 0;
    json_t *q = json_object_get(root, "quantization_config");
    if (!q || json_is_null(q))
        return 0;
    if (!json_is_object(q))
        return shoal_err_set(err, SHOAL_EFORMAT,
                             "%s: quantization_config must be an object", what);
    json_t *m = json_object_get(q, "quant_method");
    /* gpt-oss: MXFP4 routed experts ("*_blocks" + "*_scales", OCP MX);
     * the modules it lists as not converted (attention, router,
     * embeddings, lm_head) are exactly the ones shoal reads as plain
     * tensors, so the list is not needed to bind them */
    if (json_is_string(m) && !strcmp(json_string_value(m), "mxfp4") && cfg->family &&
        cfg->family->gpt_oss) {
        cfg->mxfp4_experts = 1;
        return 0;
    }
    if (!json_is_string(m) || strcmp(json_string_value(m), "fp8"))
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "%s: quantization_config.quant_method is '%s'; expected 'fp8' "
                             "(the only quantized checkpoint shoal reads; convert others "
                             "to bf16 first)", what, m ? kind(m) : "(missing)");
    int rc = want_str(q, "fmt", "e4m3", what, err);
    if (!rc)
        rc = want_str(q, "activation_scheme", "dynamic", what, err);
    if (rc)
        return rc;
    json_t *b = json_object_get(q, "weight_block_size");
    json_int_t b0 = -1, b1 = -1;
    if (json_is_array(b) && json_array_size(b) == 2 &&
        json_is_integer(json_array_get(b, 0)) && json_is_integer(json_array_get(b, 1))) {
        b0 = json_integer_value(json_array_get(b, 0));
        b1 = json_integer_value(json_array_get(b, 1));
    }
    if (b0 != SHOAL_FP8_BLOCK || b1 != SHOAL_FP8_BLOCK) {
        if (b0 < 0)
            return shoal_err_set(err, SHOAL_EFORMAT,
                                 "%s: quantization_config.weight_block_size is missing or "
                                 "not two integers; expected [%d, %d]", what,
                                 SHOAL_FP8_BLOCK, SHOAL_FP8_BLOCK);
        return shoal_err_set(err, SHOAL_EUNSUPPORTED,
                             "%s: quantization_config.weight_block_size is [%lld, %lld]; "
                             "expected [%d, %d]", what, (long long)b0, (long long)b1,
                             SHOAL_FP8_BLOCK, SHOAL_FP8_BLOCK);
    }
    cfg->fp8_block = SHOAL_FP8_BLOCK;
    return 0;
}
