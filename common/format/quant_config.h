/* quant_config: config.json's quantization_config, the part shoal reads
 * natively (FP8 block-scaled weights, quant.h "FP8").
 * Thread: any. */
#ifndef SHOAL_QUANT_CONFIG_H
#define SHOAL_QUANT_CONFIG_H

#include <jansson.h>

#include "err.h"
#include "model_config.h"

/* Read root's "quantization_config" (absent or null: cfg->fp8_block = 0).
 * Accepted: {"quant_method": "fp8", "fmt": "e4m3" (optional),
 * "activation_scheme": "dynamic" (optional; shoal's activations stay f32),
 * "weight_block_size": [128, 128]}, which sets cfg->fp8_block = 128. Any
 * other method, format, scheme or block size is an error: the weights would
 * be read wrong.
 *   what  the source for messages (borrowed)
 * Returns 0, or SHOAL_EFORMAT / SHOAL_EUNSUPPORTED with err naming the
 * field, what was found and what is expected. */
int shoal_quant_config_parse(json_t *root, const char *what, struct shoal_model_config *cfg,
                             struct shoal_err *err);

#endif
