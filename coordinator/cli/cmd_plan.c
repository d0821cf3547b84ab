/* shoal plan: what a model needs (RAM, disk, reads per token) from its
 * config.json alone, before a download (engine/plan.h does the sizing). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "kv.h"
#include "plan.h"
#include "util.h"

static void plan_usage(void)
{
    printf("usage: shoal plan [--model] DIR|CONFIG.json [--experts int4a8|int4|int8|bf16|f32|fp8]\n"
           "                  [--dense int4a8|int4|int8|bf16|f32|fp8] [--group 32|64|128]\n"
           "                  [--ram SIZE] [--ctx N] [--kv f32|f16|bf16] [--workers N]\n"
           "                  [--hit-rate R] [--json]\n\n"
           "Sizes a model from its config.json alone (nothing else is read): the resident\n"
           "trunk, the experts on disk and per expert, the KV cache per token, what fits\n"
           "in RAM as expert cache, and the bytes a token reads. Sizes are those of the\n"
           "container 'shoal convert' writes with the same --experts/--dense/--group.\n\n"
           "  --model DIR, DIR     a checkpoint or container directory, or a config.json\n"
           "  --experts T          routed experts' dtype (default bf16, as convert; fp8 for\n"
           "                       an FP8 checkpoint, which convert keeps FP8)\n"
           "  --dense T            the trunk's dtype (default bf16 whatever --experts is, as\n"
           "                       convert; fp8 for an FP8 checkpoint)\n"
           "  --group G            quantization group of int8/int4 (default 64)\n"
           "  --ram SIZE           RAM of the machine (e.g. 24G; binary units)\n"
           "  --ctx N              tokens of KV cache to budget (default: as run sizes its\n"
           "                       cache, max_position_embeddings up to 4096)\n"
           "  --kv T               the KV cache dtype, f32 (default), f16 or bf16\n"
           "  --workers N          split the experts over N expert workers\n"
           "  --hit-rate R         expert cache hit rate for the disk reads (default 0.9)\n"
           "  --json               print the figures as one JSON object\n");
}

/* The config.json text of path: a file, DIR/config.json, or the config a
 * container's shoal.json records. Returns 0, or an exit status after one
 * error line. */
static int load_config(const char *path, char **text, size_t *len, char **what)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        shoal_cli_error("plan: '%s' does not exist (expected a config.json or a directory "
                        "holding one)", path);
        return 2;
    }
    if (!S_ISDIR(st.st_mode)) {
        *what = shoal_xstrdup(path);
        return shoal_cli_read_input(path, 16u << 20, text, len);
    }
    char *cfg = shoal_path_join(path, "config.json");
    if (stat(cfg, &st) == 0) {
        *what = cfg;
        return shoal_cli_read_input(cfg, 16u << 20, text, len);
    }
    free(cfg);
    char *man = shoal_path_join(path, "shoal.json");
    json_error_t jerr;
    json_t *m = json_load_file(man, 0, &jerr);
    json_t *c = m ? json_object_get(m, "config") : NULL;
    if (!json_is_object(c)) {
        shoal_cli_error("plan: '%s' holds neither config.json nor a shoal.json with a config",
                        path);
        free(man);
        json_decref(m);
        return 2;
    }
    *text = json_dumps(c, JSON_COMPACT);
    *len = *text ? strlen(*text) : 0;
    *what = man;
    json_decref(m);
    return *text ? 0 : 1;
}

/* Ring of buffers for the sizes one printf shows. */
struct human_bufs {
    char b[8][32];
    unsigned n;
};

/* "1.23 GiB" (binary units, as --ram takes them), in the next buffer. */
static const char *human(struct human_bufs *h, double b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    char *buf = h->b[h->n++ % 8];
    int i = 0;
    for (; i < 4 && (b >= 1024 || b <= -1024); i++)
        b /= 1024;
    snprintf(buf, sizeof h->b[0], i ? "%.2f %s" : "%.0f %s", b, u[i]);
    return buf;
}

#define H(x) human(&hb, (double)(x))

static const char *const part_names[SHOAL_PLAN_N_PART] = {
    "embeddings", "lm_head", "attention", "routers", "shared_experts", "dense_layers", "norms"};

static void print_text(const struct shoal_plan *o, const struct shoal_plan_params *p,
                       const char *what)
{
    struct human_bufs hb = {.n = 0};
    printf("model        %s (%s): %lld layers (%lld MoE)", o->model_type, what,
           (long long)o->n_layer, (long long)o->n_moe_layer);
    if (o->n_mtp_layer)
        printf(" + %lld MTP", (long long)o->n_mtp_layer);
    printf(", %lld experts top-%lld", (long long)o->n_expert, (long long)o->n_expert_used);
    if (o->n_shared_expert)
        printf(" + %lld shared", (long long)o->n_shared_expert);
    printf("%s\n", o->mla ? ", MLA" : "");
    printf("parameters   %.2f B total (%.2f B per token)", o->params_total / 1e9,
           o->params_active / 1e9);
    if (o->params_mtp)
        printf(", %.2f B with the MTP layers", (o->params_total + o->params_mtp) / 1e9);
    printf("\ndtypes       experts %s, dense %s, group %d (1-D tensors f32 when quantized)",
           shoal_dtype_name(p->experts_dtype), shoal_dtype_name(p->dense_dtype), p->group);
    if (p->experts_dtype == SHOAL_DTYPE_FP8 || p->dense_dtype == SHOAL_DTYPE_FP8)
        printf("; FP8 in %dx%d blocks as the checkpoint ships it (embeddings, lm_head, "
               "routers and norms BF16)", SHOAL_FP8_BLOCK, SHOAL_FP8_BLOCK);
    printf("\n");
    printf("resident     %s trunk:", H(o->trunk_bytes));
    for (int i = 0; i < SHOAL_PLAN_N_PART; i++)
        if (o->part_bytes[i])
            printf(" %s %s%s", part_names[i], H(o->part_bytes[i]),
                   i + 1 < SHOAL_PLAN_N_PART ? "," : "");
    printf("\nexperts      %s on disk: %lld x %lld experts x %llu bytes (%s; weights %llu "
           "bytes, 4 KiB-aligned blob as convert writes it)\n", H(o->experts_bytes),
           (long long)o->n_moe_layer, (long long)o->n_expert,
           (unsigned long long)o->expert_blob_bytes, H(o->expert_blob_bytes),
           (unsigned long long)o->expert_weight_bytes);
    if (o->mtp_bytes)
        printf("MTP          %s on disk, never loaded\n", H(o->mtp_bytes));
    if (o->mla)
        printf("KV cache     %s per token (MLA: %s latent kv_lora_rank %lld + rope key "
               "qk_rope_head_dim %lld per layer; K and V per head would be %s)\n",
               H(o->kv_bytes_per_token), shoal_kv_dtype_name(p->kv_dtype),
               (long long)o->kv_lora_rank, (long long)o->qk_rope_head_dim,
               H(o->kv_per_head_bytes_per_token));
    else
        printf("KV cache     %s per token (%s K and V, as shoal's cache stores them)\n",
               H(o->kv_bytes_per_token), shoal_kv_dtype_name(p->kv_dtype));
    printf("KV budget    %s for %lld tokens\n", H(o->kv_budget_bytes), (long long)o->ctx);
    if (p->ram) {
        printf("RAM %-8s trunk %s + KV %s leaves %s for the expert cache", H(p->ram),
               H(o->trunk_bytes), H(o->kv_budget_bytes), H(o->cache_bytes));
        if (o->cache_bytes > 0)
            printf(": %llu experts (%.1f %% of all)\n", (unsigned long long)o->cache_experts,
                   100.0 * (double)o->cache_experts /
                   (double)((uint64_t)o->n_expert * (uint64_t)o->n_moe_layer));
        else
            printf(": the trunk and KV do not fit\n");
    }
    printf("per token    reads %s of experts (%lld x %s x %lld MoE layers); at hit rate "
           "%.2f, %s from disk\n", H(o->token_expert_bytes), (long long)o->n_expert_used,
           H(o->expert_blob_bytes), (long long)o->n_moe_layer, p->hit_rate,
           H(o->token_disk_bytes));
    if (p->workers > 0) {
        printf("workers %-4d each holds %lld experts per MoE layer, %s on disk; reads %s per "
               "token on average, %s from disk", p->workers,
               (long long)o->worker_experts_per_layer, H(o->worker_expert_bytes),
               H(o->worker_token_bytes), H(o->worker_token_disk_bytes));
        if (p->ram)
            printf("; caches %llu experts in its --ram",
                   (unsigned long long)o->worker_cache_experts);
        printf(" (the coordinator holds the trunk and KV)\n");
    }
}

static void print_json(const struct shoal_plan *o, const struct shoal_plan_params *p,
                       const char *what)
{
    json_t *parts = json_object();
    for (int i = 0; i < SHOAL_PLAN_N_PART; i++)
        json_object_set_new(parts, part_names[i], json_integer((json_int_t)o->part_bytes[i]));
#define I(x) json_integer((json_int_t)(x))
    json_t *j = json_pack(
        "{s:s, s:s, s:b, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:i}",
        "config", what, "model_type", o->model_type, "runnable", o->runnable, "mla", o->mla,
        "n_layer", (json_int_t)o->n_layer, "n_moe_layer", (json_int_t)o->n_moe_layer,
        "n_mtp_layer", (json_int_t)o->n_mtp_layer, "n_expert", (json_int_t)o->n_expert,
        "n_expert_used", (json_int_t)o->n_expert_used,
        "n_shared_expert", (json_int_t)o->n_shared_expert,
        "experts_dtype", shoal_dtype_name(p->experts_dtype),
        "dense_dtype", shoal_dtype_name(p->dense_dtype), "group", p->group);
    json_object_set_new(j, "params_total", I(o->params_total));
    json_object_set_new(j, "params_total_with_mtp", I(o->params_total + o->params_mtp));
    json_object_set_new(j, "params_active", I(o->params_active));
    json_object_set_new(j, "params_expert", I(o->params_expert_one));
    json_object_set_new(j, "resident_bytes", I(o->trunk_bytes));
    json_object_set_new(j, "resident_parts", parts);
    json_object_set_new(j, "expert_bytes", I(o->expert_blob_bytes));
    json_object_set_new(j, "expert_weight_bytes", I(o->expert_weight_bytes));
    json_t *comps = json_array();
    for (int c = 0; c < o->n_expert_comp; c++)
        json_array_append_new(comps, I(o->expert_comp_bytes[c]));
    json_object_set_new(j, "expert_components", comps);
    json_object_set_new(j, "experts_bytes", I(o->experts_bytes));
    json_object_set_new(j, "mtp_bytes", I(o->mtp_bytes));
    json_object_set_new(j, "kv_bytes_per_token", I(o->kv_bytes_per_token));
    json_object_set_new(j, "kv_mla_bytes_per_token", I(o->kv_mla_bytes_per_token));
    json_object_set_new(j, "kv_per_head_bytes_per_token", I(o->kv_per_head_bytes_per_token));
    json_object_set_new(j, "ctx", I(o->ctx));
    json_object_set_new(j, "kv", json_string(shoal_kv_dtype_name(p->kv_dtype)));
    json_object_set_new(j, "kv_budget_bytes", I(o->kv_budget_bytes));
    json_object_set_new(j, "hit_rate", json_real(p->hit_rate));
    json_object_set_new(j, "token_expert_bytes", I(o->token_expert_bytes));
    json_object_set_new(j, "token_disk_bytes", I(o->token_disk_bytes));
    if (p->ram) {
        json_object_set_new(j, "ram", I(p->ram));
        json_object_set_new(j, "cache_bytes", I(o->cache_bytes));
        json_object_set_new(j, "cache_experts", I(o->cache_experts));
    }
    if (p->workers > 0)
        json_object_set_new(j, "workers",
                            json_pack("{s:i, s:I, s:I, s:I, s:I, s:I}", "count", p->workers,
                                      "experts_per_layer", (json_int_t)o->worker_experts_per_layer,
                                      "expert_bytes", (json_int_t)o->worker_expert_bytes,
                                      "token_bytes", (json_int_t)o->worker_token_bytes,
                                      "token_disk_bytes", (json_int_t)o->worker_token_disk_bytes,
                                      "cache_experts", (json_int_t)o->worker_cache_experts));
#undef I
    char *s = json_dumps(j, JSON_INDENT(1));
    printf("%s\n", s);
    free(s);
    json_decref(j);
}

/* A container directory (DIR/shoal.json) plans the dtypes it was converted
 * to: its experts' dtype and group, the dtype of its first attention
 * tensor for the trunk, its KV dtype; each only where the command line did
 * not choose. Anything missing or unreadable leaves the defaults. */
static void container_defaults(const char *dir, struct shoal_plan_params *p, int set_experts,
                               int set_dense, int set_group, int set_kv)
{
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return;
    char *man = shoal_path_join(dir, "shoal.json");
    json_t *m = json_load_file(man, 0, NULL);
    free(man);
    if (!m)
        return;
    enum shoal_dtype t;
    json_t *ex = json_object_get(m, "experts");
    const char *ed = json_string_value(json_object_get(ex, "dtype"));
    if (!set_experts && ed && shoal_dtype_parse(ed, &t) == 0)
        p->experts_dtype = t;
    json_t *g = json_object_get(ex, "group");
    if (!set_group && json_is_integer(g) &&
        (json_integer_value(g) == 32 || json_integer_value(g) == 64 ||
         json_integer_value(g) == 128))
        p->group = (int)json_integer_value(g);
    size_t i;
    json_t *tn;
    json_array_foreach(json_object_get(json_object_get(m, "dense"), "tensors"), i, tn) {
        const char *name = json_string_value(json_object_get(tn, "name"));
        const char *dd = json_string_value(json_object_get(tn, "dtype"));
        if (name && dd && strstr(name, "attn_q") && shoal_dtype_parse(dd, &t) == 0) {
            if (!set_dense)
                p->dense_dtype = t;
            break;
        }
    }
    const char *kv = json_string_value(json_object_get(m, "kv"));
    if (!set_kv && kv)
        shoal_kv_dtype_parse(kv, &p->kv_dtype);
    json_decref(m);
}

int shoal_cmd_plan(int argc, char **argv)
{
    struct shoal_plan_params p = {.experts_dtype = SHOAL_DTYPE_BF16,
                                  .dense_dtype = SHOAL_DTYPE_BF16, .group = 64,
                                  .hit_rate = 0.9};
    const char *model = NULL;
    int as_json = 0, set_experts = 0, set_dense = 0, set_group = 0, set_kv = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plan_usage();
            return 0;
        }
        if (!strcmp(a, "--json")) {
            as_json = 1;
            continue;
        }
        static const char *const valued[] = {"--model", "--experts", "--dense", "--group",
                                             "--ram", "--ctx", "--workers", "--hit-rate",
                                             "--kv"};
        int k = -1;
        for (int j = 0; j < 9; j++)
            if (!strcmp(a, valued[j]))
                k = j;
        if (k < 0 && a[0] == '-' && a[1]) {
            shoal_cli_error("plan: unknown option '%s' (see 'shoal plan --help')", a);
            return 2;
        }
        if (k < 0) {
            if (shoal_cli_take_path("plan", "model", a, &model) < 0)
                return 2;
            continue;
        }
        if (i + 1 >= argc) {
            shoal_cli_error("%s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        long long n;
        unsigned long long sz;
        int bad = 0;
        switch (k) {
        case 0: bad = shoal_cli_take_path("plan", "model", v, &model) < 0; break;
        case 1: bad = shoal_cli_parse_dtype(a, v, &p.experts_dtype); set_experts = 1; break;
        case 2: bad = shoal_cli_parse_dtype(a, v, &p.dense_dtype); set_dense = 1; break;
        case 3: bad = shoal_cli_parse_group(a, v, &p.group); set_group = 1; break;
        case 4:
            bad = shoal_cli_parse_size(a, v, &sz);
            if (!bad && (sz == 0 || sz > (1ull << 60))) {
                shoal_cli_error("--ram expects a size such as 24G, got '%s'", v);
                bad = 1;
            }
            p.ram = sz;
            break;
        case 5: bad = shoal_cli_parse_i64(a, v, 1, 1ll << 24, &n); p.ctx = n; break;
        case 6: bad = shoal_cli_parse_i64(a, v, 1, 4096, &n); p.workers = (int)n; break;
        case 7: bad = shoal_cli_parse_f64(a, v, 0, 1, &p.hit_rate); break;
        case 8: bad = shoal_cli_parse_kv(a, v, &p.kv_dtype); set_kv = 1; break;
        }
        if (bad)
            return 2;
    }
    if (!model) {
        shoal_cli_error("plan: usage: shoal plan DIR|CONFIG.json [options] (missing the "
                        "model)");
        return 2;
    }
    char *text = NULL, *what = NULL;
    size_t len = 0;
    int rc = load_config(model, &text, &len, &what);
    if (rc) {
        free(what);
        return rc;
    }
    /* an FP8 checkpoint (quantization_config fp8, DeepSeek-V3 / Kimi-K2)
     * converts to FP8 by default, as `shoal convert` keeps it */
    json_t *root = json_loadb(text, len, 0, NULL);
    json_t *qm = json_object_get(json_object_get(root, "quantization_config"), "quant_method");
    if (json_is_string(qm) && !strcmp(json_string_value(qm), "fp8")) {
        if (!set_experts)
            p.experts_dtype = SHOAL_DTYPE_FP8;
        if (!set_dense)
            p.dense_dtype = SHOAL_DTYPE_FP8;
    }
    /* gpt-oss ships MXFP4 experts and a BF16 trunk, which convert keeps */
    if (json_is_string(qm) && !strcmp(json_string_value(qm), "mxfp4") && !set_experts)
        p.experts_dtype = SHOAL_DTYPE_MXFP4;
    json_decref(root);
    /* a container: the dtypes it holds (over the checkpoint's above) */
    container_defaults(model, &p, set_experts, set_dense, set_group, set_kv);
    struct shoal_err err = {0};
    struct shoal_plan o;
    if (shoal_plan_config(text, len, what, &p, &o, &err)) {
        shoal_cli_error("plan: %s", err.msg);
        rc = 2;
    } else if (as_json) {
        print_json(&o, &p, what);
    } else {
        print_text(&o, &p, what);
    }
    free(text);
    free(what);
    return rc;
}
