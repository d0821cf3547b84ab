/* shoal convert / shoal inspect: make and examine containers. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "container.h"
#include "ggml_types.h"
#include "gguf_arch.h"
#include "kv.h"
#include "model.h"
#include "util.h"

struct progress {
    double t0;
    int tty;
    const char *what;
};

static void show_progress(uint64_t done, uint64_t total, void *user)
{
    struct progress *p = user;
    if (!p->tty)
        return;
    double el = shoal_time_s() - p->t0;
    double rate = el > 0 ? (double)done / el : 0;
    double eta = rate > 0 ? (double)(total - done) / rate : 0;
    int width = 30, fill = total ? (int)((double)done / (double)total * width) : width;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r%s [%s] %5.1f%%  %.1f/%.1f MB  %.1f MB/s  ETA %.0fs   ", p->what, bar,
            total ? 100.0 * (double)done / (double)total : 100.0, (double)done / 1e6,
            (double)total / 1e6, rate / 1e6, eta);
    if (done >= total)
        fprintf(stderr, "\n");
}

/* The dtype of the first routed expert's gate in the first MoE layer (F32
 * when the model has none; a checkpoint's experts share one dtype, the
 * writer checks each). */
static enum shoal_dtype source_experts_dtype(const struct shoal_model *m)
{
    for (int64_t il = 0; il < m->cfg.n_layer; il++)
        if (m->layers[il].experts)
            return m->layers[il].experts[0].w_gate.dtype;
    return SHOAL_DTYPE_F32;
}

int shoal_cmd_convert(int argc, char **argv)
{
    struct shoal_convert_params p = shoal_convert_params_default();
    int set_experts = 0, set_dense = 0;
    const char *src = NULL, *dst = NULL;
    char **words = shoal_xcalloc((size_t)argc, sizeof *words);
    int n_words = 0, rc = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: shoal convert [--model] SRC [--out] DST [--experts int4a8|int4|int8|fp8|mxfp4|bf16|f32]\n"
                   "                     [--dense int4a8|int4|int8|fp8|bf16|f32] [--group 32|64|128]\n"
                   "                     [--kv f32|f16|bf16] [--force]\n\n"
                   "Converts a Hugging Face checkpoint directory SRC (config.json, *.safetensors,\n"
                   "tokenizer.json) or a GGUF file SRC into a shoal container DST (docs/FORMAT.md).\n"
                   "From a GGUF every tensor keeps its type (Q4_K, IQ2_XXS, MXFP4, ...: dtype GGML\n"
                   "in the manifest), so DST runs with the GGUF's logits bits and adds checksums,\n"
                   "page-aligned experts, --mirror and shoal shard; --experts / --dense given\n"
                   "requantize (each tensor dequantized by its type's reference, then quantized).\n\n"
                   "  --model SRC, SRC     the Hugging Face checkpoint directory, or a GGUF file\n"
                   "                       (any file of a split set NAME-00001-of-0000N.gguf)\n"
                   "  --out DST, DST       the container directory to write\n"
                   "  --experts T          routed experts' dtype (default bf16; fp8 when SRC is an\n"
                   "                       FP8 checkpoint, which keeps its E4M3 codes and block scales;\n"
                   "                       mxfp4 when its experts are MXFP4, as gpt-oss ships them)\n"
                   "  --dense T            dense tensors' dtype (default bf16 whatever --experts is,\n"
                   "                       as a 4-bit trunk costs far more accuracy than it saves\n"
                   "                       bytes; fp8 when SRC is an FP8 checkpoint); with int4/int4a8\n"
                   "                       the routers stay int8, 1-D tensors f32 (int4a8 runs the\n"
                   "                       trunk's linears against int8 activations); with fp8 the\n"
                   "                       tensors that are not FP8 in SRC keep their dtype\n"
                   "  --group G            quantization group of int8/int4 (default 64)\n"
                   "  --kv T               the KV cache dtype runs of DST use unless they pass\n"
                   "                       --kv (default f32; f16/bf16 halve its bytes)\n"
                   "  --force              replace an existing DST\n");
            free(words);
            return 0;
        }
        if (!strcmp(a, "--force")) {
            p.force = 1;
            continue;
        }
        if (!strcmp(a, "--experts") || !strcmp(a, "--dense") || !strcmp(a, "--group") ||
            !strcmp(a, "--kv") ||
            !strcmp(a, "--model") || !strcmp(a, "--out")) {
            if (i + 1 >= argc) {
                shoal_cli_error("%s needs a value", a);
                goto out;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--model"))
                src = v;
            if (!strcmp(a, "--out"))
                dst = v;
            if (!strcmp(a, "--experts") && shoal_cli_parse_dtype(a, v, &p.experts_dtype))
                goto out;
            if (!strcmp(a, "--dense") && shoal_cli_parse_dtype(a, v, &p.dense_dtype))
                goto out;
            set_experts |= !strcmp(a, "--experts");
            set_dense |= !strcmp(a, "--dense");
            if (!strcmp(a, "--group") && shoal_cli_parse_group(a, v, &p.group))
                goto out;
            if (!strcmp(a, "--kv") && shoal_cli_parse_kv(a, v, &p.kv_dtype))
                goto out;
            continue;
        }
        if (a[0] == '-') {
            shoal_cli_error("convert: unknown option '%s' (see 'shoal convert --help')", a);
            goto out;
        }
        words[n_words++] = argv[i];
    }
    const struct shoal_cli_slot slots[] = {{"--model", &src}, {"--out", &dst}};
    if (shoal_cli_assign_paths("convert", words, n_words, slots, 2))
        goto out;
    if (!src || !dst) {
        shoal_cli_error("convert: usage: shoal convert SRC DST [options] (missing %s)",
                        src ? "DST" : "SRC");
        goto out;
    }
    const int gguf = shoal_model_is_gguf(src);
    if (!gguf && shoal_cli_check_model_dir(src, 1))
        goto out;   /* a missing or non-directory SRC: a usage error, exit 2 */
    rc = 1;
    struct shoal_err err = {0};
    struct shoal_model *m = shoal_model_load(src, &err);
    if (!m) {
        shoal_cli_error("%s", err.msg);
        if (gguf && shoal_err_is_bad_input(err.code))
            rc = 2;   /* a truncated or corrupt GGUF, as shoal run says */
        goto out;
    }
    if (m->ct) {
        shoal_cli_error("convert: '%s' is already a shoal container; convert from the "
                        "Hugging Face checkpoint", src);
        shoal_model_free(m);
        goto out;
    }
    /* a GGUF's split attn_k_b / attn_v_b in block types stay as shipped
     * (contract 2); requantized (--dense), they become kv_b_proj in F32
     * (their exact values), then --dense's type */
    if (gguf && set_dense)
        shoal_gguf_arch_kv_b_f32(m);
    /* an FP8 checkpoint keeps its precision unless told otherwise (contract
     * 2): FP8 by default where it is FP8 */
    if (m->cfg.fp8_block) {
        if (!set_experts && source_experts_dtype(m) == SHOAL_DTYPE_FP8)
            p.experts_dtype = SHOAL_DTYPE_FP8;
        if (!set_dense)
            p.dense_dtype = SHOAL_DTYPE_FP8;
    }
    /* MXFP4 experts (gpt-oss) likewise stay MXFP4 unless --experts says */
    if (!set_experts && source_experts_dtype(m) == SHOAL_DTYPE_MXFP4)
        p.experts_dtype = SHOAL_DTYPE_MXFP4;
    /* a GGUF: every tensor keeps its type, unless --experts / --dense say */
    if (gguf && !set_experts)
        p.experts_dtype = SHOAL_DTYPE_GGML;
    if (gguf && !set_dense)
        p.dense_dtype = SHOAL_DTYPE_GGML;
    if (!gguf) {
        /* the container copies the checkpoint's tokenizer: say when there is none */
        char *tj = shoal_path_join(src, "tokenizer.json");
        char *tk = shoal_path_join(src, "tiktoken.model");
        if (!shoal_exists(tj) && !shoal_exists(tk))
            fprintf(stderr, "shoal: warning: convert: '%s' has no tokenizer.json or "
                    "tiktoken.model: the container will have no tokenizer, so prompts "
                    "must be token ids ('shoal run --tokens IDS') and the output shows "
                    "token ids\n", src);
        free(tj);
        free(tk);
    }
    struct progress pr = {.t0 = shoal_time_s(), .tty = isatty(2), .what = "convert"};
    p.progress = show_progress;
    p.progress_user = &pr;
    int crc = shoal_container_convert(m, src, dst, &p, &err);
    shoal_model_free(m);
    if (crc) {
        shoal_cli_error("%s", err.msg);
        if (gguf && shoal_err_is_bad_input(crc))
            rc = 2;   /* bad bytes in the GGUF (a NaN block scale) */
        goto out;
    }
    fprintf(stderr, "shoal: wrote %s in %.1f s\n", dst, shoal_time_s() - pr.t0);
    rc = 0;
out:
    free(words);
    return rc;
}

/* 1 if path ends in ".gguf" or its first bytes are GGUF's magic. */
static int is_gguf(const char *path)
{
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".gguf"))
        return 1;
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    int yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f)
        fclose(f);
    return yes;
}

int shoal_cmd_inspect(int argc, char **argv)
{
    const char *dir = NULL;
    int verify = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: shoal inspect [--model] DIR [--verify]\n"
                   "       shoal inspect [--model] FILE.gguf [--json]\n\n"
                   "Describes a shoal container or shard, or a GGUF model file.\n\n"
                   "  --model DIR, DIR     the container (made by 'shoal convert', 'shoal shard'\n"
                   "                       or 'shoal synth')\n"
                   "  --verify             check every checksum (containers)\n"
                   "  --model FILE.gguf    a GGUF file, or any file of a split set\n"
                   "                       (NAME-00001-of-0000N.gguf): its architecture, tensor\n"
                   "                       groups with their ggml types and bytes, the bytes of\n"
                   "                       one expert, and what shoal can do with each type\n"
                   "  --json               GGUF only: the same as one JSON object\n");
            return 0;
        }
        if (!strcmp(argv[i], "--verify")) {
            verify = 1;
            continue;
        }
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(argv[i], "--model")) {
            if (i + 1 >= argc) {
                shoal_cli_error("--model needs a value");
                return 2;
            }
            i++;
        } else if (argv[i][0] == '-') {
            shoal_cli_error("inspect: unknown option '%s' (see 'shoal inspect --help')",
                            argv[i]);
            return 2;
        }
        if (shoal_cli_take_path("inspect", "container", argv[i], &dir) < 0)
            return 2;
    }
    if (!dir) {
        shoal_cli_error("inspect: usage: shoal inspect DIR [--verify]");
        return 2;
    }
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            shoal_cli_error("inspect: '%s' does not exist (expected a shoal container "
                            "directory or a .gguf file)", dir);
        else
            shoal_cli_error("inspect: '%s': %s", dir, strerror(errno));
        return 2;
    }
    if (S_ISREG(st.st_mode) && is_gguf(dir)) {
        if (verify) {
            shoal_cli_error("inspect: --verify is for shoal containers; a GGUF file has no "
                            "checksums");
            return 2;
        }
        return shoal_cli_inspect_gguf(dir, json);
    }
    if (json) {
        shoal_cli_error("inspect: --json is for GGUF files so far; '%s' is not one", dir);
        return 2;
    }
    if (!shoal_container_is(dir)) {
        if (shoal_cli_check_model_dir(dir, 1))
            return 2;   /* not a model at all: a usage error */
        shoal_cli_error("inspect: '%s' is a Hugging Face checkpoint, not a shoal container "
                        "(no shoal.json); make one with 'shoal convert %s DIR'", dir, dir);
        return 1;
    }
    struct shoal_err err = {0};
    struct shoal_model_config cfg;
    struct shoal_container *ct = shoal_container_open(dir, &cfg, &err);
    if (!ct) {
        shoal_cli_error("%s", err.msg);
        return 1;
    }
    uint64_t dense_bytes = 0;
    int n_moe = 0;
    for (size_t i = 0; i < ct->n_dense; i++)
        dense_bytes += ct->dense[i].bytes;
    for (int64_t il = 0; il < cfg.n_layer; il++)
        n_moe += ct->layer_offset[il] != UINT64_MAX;
    uint64_t expert_bytes = 0;   /* a shard: held only */
    for (int64_t il = 0; il < cfg.n_layer; il++)
        for (int64_t ie = 0; ie < cfg.n_expert; ie++)
            expert_bytes += shoal_container_holds(ct, il, ie) ? shoal_container_blob_bytes(ct, il)
                                                              : 0;
    printf("%s    %s (format version %d)\n", ct->shard.count ? "shard    " : "container", dir,
           ct->version);
    printf("fingerprint  %016" PRIx64 "\n", ct->fingerprint);
    printf("family       %s: %lld layers (%d MoE), n_embd %lld, heads %lld/%lld x %lld, vocab %lld\n",
           cfg.family->model_type, (long long)cfg.n_layer, n_moe, (long long)cfg.n_embd,
           (long long)cfg.n_head, (long long)(cfg.family->mla ? 1 : cfg.n_head_kv),
           (long long)cfg.head_dim, (long long)cfg.n_vocab);
    printf("experts      %lld per layer, top-%lld, n_ff_exp %lld, %s",
           (long long)cfg.n_expert, (long long)cfg.n_expert_used, (long long)cfg.n_ff_exp,
           shoal_dtype_name(ct->experts_dtype));
    if (shoal_dtype_is_quant(ct->experts_dtype))
        printf(" group %d", ct->experts_group);
    if (ct->layer_layout)   /* GGML: each layer its own types and blob */
        printf(" (each layer's types its own, as the GGUF had them)\n"
               "per expert   up to %" PRIu64 " bytes (each layer's blob 4 KiB aligned)\n",
               ct->blob_bytes);
    else
        printf("\nper expert   %" PRIu64 " bytes (gate %" PRIu64 ", up %" PRIu64 ", down %"
               PRIu64 ", 4 KiB aligned)\n", ct->blob_bytes, ct->comp[0].bytes,
               ct->comp[1].bytes, ct->comp[2].bytes);
    printf("dense bytes  %" PRIu64 " (%.1f MB, %zu tensors:", dense_bytes, dense_bytes / 1e6,
           ct->n_dense);
    for (int t = 0, first = 1; t < SHOAL_DTYPE_COUNT; t++) {
        size_t n = 0;
        for (size_t i = 0; i < ct->n_dense; i++)
            n += ct->dense[i].w.dtype == (enum shoal_dtype)t;
        if (n) {
            printf("%s %zu %s", first ? "" : ",", n, shoal_dtype_name((enum shoal_dtype)t));
            first = 0;
        }
    }
    printf(")%s\n", ct->dense_map ? "" : " (not in this shard)");
    /* K and V of every layer at the file's KV dtype (what 'shoal plan' prints);
     * MLA: the latent and rope key of every layer */
    const uint64_t kv_token = (uint64_t)cfg.n_layer * (uint64_t)shoal_kv_elems_per_token(&cfg) *
                              shoal_dtype_size(ct->kv_dtype);
    printf("kv cache     %s, %" PRIu64 " bytes per token (the file's default; run --kv "
           "overrides)", shoal_kv_dtype_name(ct->kv_dtype), kv_token);
    if (cfg.family->mla)
        printf("; MLA: kv_lora_rank %lld + qk_rope_head_dim %lld a layer",
               (long long)cfg.kv_lora_rank, (long long)cfg.qk_rope_head_dim);
    printf("\n");
    printf("expert bytes %" PRIu64 " (%.1f MB)\n", expert_bytes, expert_bytes / 1e6);
    int ggml = ct->experts_dtype == SHOAL_DTYPE_GGML;
    for (size_t i = 0; i < ct->n_dense; i++)
        ggml |= ct->dense[i].w.dtype == SHOAL_DTYPE_GGML;
    if (ggml)
        shoal_cli_print_types(ct);
    shoal_cli_print_shard(ct);
    if (ct->shard.count && !ct->shard.has_dense && ct->n_dense)
        printf("dense        the manifest's %zu tensors (their bytes are in the full "
               "container's dense.bin, not in this shard):\n", ct->n_dense);
    size_t shown = 0;
    for (size_t i = 0; i < ct->n_dense && shown < 6; i++, shown++) {
        const struct shoal_container_tensor *t = &ct->dense[i];
        const char *dt = t->w.dtype == SHOAL_DTYPE_GGML ? shoal_ggml_type_name(t->w.ggml_type)
                                                        : shoal_dtype_name(t->w.dtype);
        if (t->n_dims == 1)
            printf("  %-28s %-6s [%lld]\n", t->name, dt, (long long)t->w.cols);
        else
            printf("  %-28s %-6s [%lld, %lld]\n", t->name, dt, (long long)t->w.rows,
                   (long long)t->w.cols);
    }
    if (ct->n_dense > shown)
        printf("  ... %zu more dense tensors\n", ct->n_dense - shown);
    int rc = 0;
    if (verify) {
        struct progress pr = {.t0 = shoal_time_s(), .tty = isatty(2), .what = "verify"};
        if (shoal_container_verify(ct, show_progress, &pr, &err)) {
            shoal_cli_error("%s", err.msg);
            rc = 1;
        } else {
            printf("verify       ok: every %s matches its xxh64\n",
                   ct->shard.count ? (ct->dense_map ? "dense tensor and held expert"
                                                    : "held expert")
                                   : "dense tensor and expert");
        }
    }
    shoal_container_close(ct);
    return rc;
}
