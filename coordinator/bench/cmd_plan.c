/* shoal plan: will a model run on these machines, and how fast: sizes from
 * its config.json alone (engine/plan.h), the verdict, memory and tok/s
 * (engine/plan_speed.h), --measure through bench_probe.h. */
#include <ctype.h>
#include <jansson.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_probe.h"
#include "bench_tools.h"
#include "cli.h"
#include "kv.h"
#include "parse.h"
#include "plan.h"
#include "plan_speed.h"
#include "quant.h"
#include "util.h"

static void plan_usage(void)
{
    printf("usage: shoal plan [--model] MODEL [--ram SIZE[,SIZE...]] [--machines N]\n"
           "                  [--disk RATE[,...]] [--mem-bw RATE[,...]] [--flops RATE[,...]]\n"
           "                  [--link RATE[,...]] [--rtt TIME] [--coordinator-experts on|off]\n"
           "                  [--measure] [--prompt N] [--ctx N] [--reserve SIZE]\n"
           "                  [--routing FILE] [--experts T] [--dense T] [--group G]\n"
           "                  [--kv T] [--json]\n\n"
           "Says whether a model runs on these machines and how fast, from its config.json\n"
           "(no weights are read; --measure, --routing and a container's routing counts\n"
           "are): the verdict (exit 0: runs, 3: does not fit, with\n"
           "the first reason), memory per machine (trunk, KV, reserve, expert cache),\n"
           "predicted decode and prefill tok/s with the bound that sets each, the one\n"
           "change that would help most, and the flags to run it with. Sizes are those of\n"
           "the container 'shoal convert' writes. docs/OPERATIONS.md says how it predicts\n"
           "and how close it came to measured runs.\n\n"
           "  --model MODEL        a checkpoint or container directory, a config.json, or a\n"
           "                       GGUF file (any file of a split set), planned at the\n"
           "                       types it ships in\n"
           "  --ram SIZE[,...]     RAM of each machine, with a unit (64G, 512M); one value\n"
           "                       for all, or one per machine (machine 1 runs the\n"
           "                       coordinator). Default: this machine's RAM\n"
           "  --machines N         how many machines (default: the longest list given, or 1)\n"
           "  --reserve SIZE       RAM kept for the OS on each machine (default 10 %%, at\n"
           "                       least 1G and at most 8G)\n"
           "  --disk RATE[,...]    random expert reads, e.g. 3.5GB/s, 500MB/s (default\n"
           "                       3GB/s, or measured with --measure)\n"
           "  --mem-bw RATE[,...]  RAM read bandwidth, e.g. 60GB/s (default 50GB/s)\n"
           "  --flops RATE[,...]   GEMM rate at the experts' dtype, e.g. 300G (FLOP/s;\n"
           "                       default 300G)\n"
           "  --link RATE[,...]    each machine's network link, each way: 1gbit, 2.5gbit,\n"
           "                       10gbit, 100mbit, or bytes such as 1.25GB/s (default\n"
           "                       1gbit); machine 1's carries every worker's traffic\n"
           "  --rtt TIME           its round trip, e.g. 0.2ms, 2ms (default 0.2ms)\n"
           "  --coordinator-experts on|off  machine 1's own store serves experts too, as\n"
           "                       'shoal run --local-experts on' (default on)\n"
           "  --measure            probe this machine's RAM bandwidth, GEMM rate and (for a\n"
           "                       container) disk, as 'shoal bench' does; flags given win\n"
           "  --prompt N           prompt tokens for the prefill figure; decode is predicted\n"
           "                       at this context (default 512)\n"
           "  --ctx N              tokens of KV cache to budget (default: as run sizes its\n"
           "                       cache, max_position_embeddings up to 4096)\n"
           "  --routing FILE       routing counts (routing_counts.json, which 'shoal run'\n"
           "                       keeps beside a container) for the expert skew; a\n"
           "                       container's own file is used when present; else a curve\n"
           "                       fitted to real routing traces\n"
           "  --experts T          routed experts' dtype: int4a8|int4|int8|bf16|f32|fp8|mxfp4\n"
           "                       (default bf16, as convert; fp8 for an FP8 checkpoint,\n"
           "                       mxfp4 for gpt-oss, as they ship)\n"
           "  --dense T            the trunk's dtype (default bf16 whatever --experts is, as\n"
           "                       convert; fp8 for an FP8 checkpoint)\n"
           "  --group G            quantization group of int8/int4 (default 64)\n"
           "  --kv T               the KV cache dtype, f32 (default), f16 or bf16\n"
           "  --json               print everything as one JSON object\n");
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
                       const char *what, const char *types)
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
    if (o->params_total >= 1e9)
        printf("parameters   %.2f B total (%.2f B per token)", o->params_total / 1e9,
               o->params_active / 1e9);
    else
        printf("parameters   %.2f M total (%.2f M per token)", o->params_total / 1e6,
               o->params_active / 1e6);
    if (o->params_mtp)
        printf(", %.2f B with the MTP layers", (o->params_total + o->params_mtp) / 1e9);
    if (types)
        printf("\ndtypes       %s", types);
    else
        printf("\ndtypes       experts %s, dense %s, group %d (1-D tensors f32 when quantized)",
               shoal_dtype_name(p->experts_dtype), shoal_dtype_name(p->dense_dtype), p->group);
    if (!types && (p->experts_dtype == SHOAL_DTYPE_FP8 || p->dense_dtype == SHOAL_DTYPE_FP8))
        printf("; FP8 in %dx%d blocks as the checkpoint ships it (embeddings, lm_head, "
               "routers and norms BF16)", SHOAL_FP8_BLOCK, SHOAL_FP8_BLOCK);
    printf("\n");
    printf("resident     %s trunk:", H(o->trunk_bytes));
    for (int i = 0; i < SHOAL_PLAN_N_PART; i++)
        if (o->part_bytes[i])
            printf(" %s %s%s", part_names[i], H(o->part_bytes[i]),
                   i + 1 < SHOAL_PLAN_N_PART ? "," : "");
    if (types)
        printf("\nexperts      %s in the file: %lld x %lld experts x %llu bytes (its slices of "
               "the layer's gate, up and down tensors; read in whole pages into %s buffers)\n",
               H(o->experts_bytes), (long long)o->n_moe_layer, (long long)o->n_expert,
               (unsigned long long)o->expert_weight_bytes, H(o->expert_blob_bytes));
    else
        printf("\nexperts      %s on disk: %lld x %lld experts x %llu bytes (%s; weights %llu "
               "bytes, 4 KiB-aligned blob as convert writes it)\n", H(o->experts_bytes),
               (long long)o->n_moe_layer, (long long)o->n_expert,
               (unsigned long long)o->expert_blob_bytes, H(o->expert_blob_bytes),
               (unsigned long long)o->expert_weight_bytes);
    if (o->mtp_bytes)
        printf("MTP          %s on disk, read only when drafting (--speculate mtp)\n",
               H(o->mtp_bytes));
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
}

static void print_json(const struct shoal_plan *o, const struct shoal_plan_params *p,
                       const char *what, const char *types, json_t *speed)
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
    json_object_set_new(j, "token_expert_bytes", I(o->token_expert_bytes));
    json_object_set_new(j, "token_trunk_bytes", I(o->token_trunk_bytes));
    json_object_set_new(j, "speed", speed);
    if (types) {   /* a GGUF: the types it ships, not convert's */
        json_object_set_new(j, "gguf_types", json_string(types));
        json_object_set_new(j, "experts_dtype", json_string("as shipped"));
        json_object_set_new(j, "dense_dtype", json_string("as shipped"));
    }
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

/* ---- values with units ---- */

/* A size with a unit (K, M, G, T, binary): a bare number is refused, since
 * "--ram 64" meaning 64 bytes is never what was meant. */
static int parse_size_unit(const char *flag, const char *v, uint64_t *out)
{
    unsigned long long sz;
    size_t n = strlen(v);
    if (!n || !strchr("kKmMgGtTB", v[n - 1]) || shoal_parse_size(v, &sz) || sz == ~0ull ||
        sz == 0 || sz > (1ull << 60)) {
        shoal_cli_error("plan: %s '%s': expected a size above 0 with a unit, e.g. 64G or 512M",
                        flag, v);
        return -1;
    }
    *out = sz;
    return 0;
}

/* A rate: bytes (GB/s, MB/s, KB/s, B/s, GiB/s, MiB/s; decimal unless i),
 * or bits (gbit, mbit, kbit, Gbps, Mbps; divided by 8). bits_ok: a link. */
static int parse_rate(const char *flag, const char *v, int bits_ok, double *out)
{
    char *end = NULL;
    double x = strtod(v, &end);
    static const struct {
        const char *u;
        double mul;
        int bits;
    } units[] = {
        {"TB/s", 1e12, 0}, {"GB/s", 1e9, 0}, {"MB/s", 1e6, 0}, {"KB/s", 1e3, 0},
        {"kB/s", 1e3, 0}, {"B/s", 1, 0}, {"GiB/s", 1073741824.0, 0},
        {"MiB/s", 1048576.0, 0}, {"KiB/s", 1024.0, 0}, {"gbit", 1e9 / 8, 1},
        {"Gbit", 1e9 / 8, 1}, {"Gbit/s", 1e9 / 8, 1}, {"Gbps", 1e9 / 8, 1},
        {"mbit", 1e6 / 8, 1}, {"Mbit", 1e6 / 8, 1}, {"Mbit/s", 1e6 / 8, 1},
        {"Mbps", 1e6 / 8, 1}, {"kbit", 1e3 / 8, 1},
    };
    if (end != v && x > 0 && isfinite(x))
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (!strcmp(end, units[i].u) && (bits_ok || !units[i].bits)) {
                *out = x * units[i].mul;
                return 0;
            }
    shoal_cli_error("plan: %s '%s': expected a rate above 0 with a unit, e.g. %s", flag, v,
                    bits_ok ? "1gbit, 10gbit, 100mbit or 1.25GB/s" : "3.5GB/s or 500MB/s");
    return -1;
}

/* FLOP/s: a number with G or T (300G, 1.2T), or plain FLOP/s. */
static int parse_flops(const char *v, double *out)
{
    char *end = NULL;
    double x = strtod(v, &end);
    double mul = !strcmp(end, "T") || !strcmp(end, "TFLOPS") ? 1e12
               : !strcmp(end, "G") || !strcmp(end, "GFLOPS") ? 1e9 : 0;
    if (end == v || !(x > 0) || !isfinite(x) || mul == 0) {
        shoal_cli_error("plan: --flops '%s': expected a rate such as 300G or 1.2T (FLOP/s)", v);
        return -1;
    }
    *out = x * mul;
    return 0;
}

/* A time: 0.2ms, 150us, 0.002s. */
static int parse_time(const char *flag, const char *v, double *out)
{
    char *end = NULL;
    double x = strtod(v, &end);
    double mul = !strcmp(end, "s") ? 1 : !strcmp(end, "ms") ? 1e-3 : !strcmp(end, "us") ? 1e-6 : 0;
    if (end == v || !(x >= 0) || !isfinite(x) || mul == 0 || x * mul > 10) {
        shoal_cli_error("plan: %s '%s': expected a time such as 0.2ms, 2ms or 150us", flag, v);
        return -1;
    }
    *out = x * mul;
    return 0;
}

/* A comma-separated list of one value kind into vals[]; returns the count,
 * or -1 after an error line. */
enum list_kind { L_SIZE, L_RATE, L_LINK, L_FLOPS };

static int parse_list(const char *flag, const char *v, enum list_kind kind, double *vals)
{
    char buf[1024];
    if (strlen(v) >= sizeof buf || !*v) {
        shoal_cli_error("plan: %s: expected a value or a comma-separated list", flag);
        return -1;
    }
    strcpy(buf, v);
    int n = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == SHOAL_PLAN_MAX_MACHINES) {
            shoal_cli_error("plan: %s: at most %d machines", flag, SHOAL_PLAN_MAX_MACHINES);
            return -1;
        }
        uint64_t sz;
        if (kind == L_SIZE) {
            if (parse_size_unit(flag, t, &sz))
                return -1;
            vals[n++] = (double)sz;
        } else if (kind == L_RATE || kind == L_LINK) {
            if (parse_rate(flag, t, kind == L_LINK, &vals[n++]))
                return -1;
        } else if (parse_flops(t, &vals[n++])) {
            return -1;
        }
    }
    if (!n || v[strlen(v) - 1] == ',' || strstr(v, ",,")) {
        shoal_cli_error("plan: %s '%s' has an empty item", flag, v);
        return -1;
    }
    return n;
}

/* ---- --measure: this machine, as shoal bench measures it ---- */

/* GEMM rate of the experts' dtype on this machine: one expert-shaped
 * INT4A8 (or INT8/INT4) linear at 64 tokens for about 0.3 s on every
 * OpenMP thread. Returns FLOP/s, or 0 when the dtype has no probe. */
static double measure_flops(enum shoal_dtype dt, int group)
{
    enum shoal_quant_type qt = dt == SHOAL_DTYPE_INT8 ? SHOAL_QUANT_INT8 : SHOAL_QUANT_INT4;
    if (dt != SHOAL_DTYPE_INT4A8 && dt != SHOAL_DTYPE_INT4 && dt != SHOAL_DTYPE_INT8)
        return 0;
    const int64_t rows = 2048, cols = 2048, tok = 64;
    size_t wb = shoal_quant_matrix_bytes(qt, rows, cols, group);
    float *src = malloc((size_t)(rows * cols) * sizeof *src);
    float *x = malloc((size_t)(tok * cols) * sizeof *x);
    float *y = malloc((size_t)(tok * rows) * sizeof *y);
    void *w = malloc(wb);
    double rate = 0;
    struct shoal_err err = {0};
    if (src && x && y && w) {
        uint64_t s = 88172645463325252ull;
        for (int64_t i = 0; i < rows * cols; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            src[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
        }
        for (int64_t i = 0; i < tok * cols; i++)
            x[i] = src[i] * 2;
        if (!shoal_quant_quantize_matrix(qt, group, w, wb, src, SHOAL_DTYPE_F32, rows, cols,
                                         &err)) {
            struct shoal_quant_weight qw = {.type = qt, .group = group, .rows = rows,
                                            .cols = cols, .data = w};
            int a8 = dt == SHOAL_DTYPE_INT4A8;
            double best = 0;
            for (int rep = 0; rep < 5; rep++) {
                double t0 = shoal_time_s();
                int n = 0;
                do {
                    if (a8)
                        shoal_quant_linear_a8(y, x, tok, &qw);
                    else
                        shoal_quant_linear(y, x, tok, &qw);
                    n++;
                } while (shoal_time_s() - t0 < 0.06);
                double r = 2.0 * (double)(rows * cols * tok) * n / (shoal_time_s() - t0);
                best = r > best ? r : best;
            }
            rate = best;
        }
    }
    free(src), free(x), free(y), free(w);
    return rate;
}

/* ---- routing skew from routing counts ---- */

/* shares [n_moe_layer][n_expert] from a routing_counts.json (hot_set.h:
 * "counts", one row per layer) or a synthetic container's synth.json (its
 * layers' "target_share", the frequencies its router was built to give);
 * rows that sum to zero (dense layers, or never routed) are skipped and
 * missing MoE layers take the default curve. Returns the array (owned) or
 * NULL with *why set when the file does not fit this model. */
static double *load_shares(const char *path, const struct shoal_plan *o, const char **why)
{
    json_error_t jerr;
    json_t *r = json_load_file(path, 0, &jerr);
    if (!r) {   /* the file itself: missing, unreadable, or not JSON */
        static char msg[400];
        FILE *f = shoal_is_dir(path) ? NULL : fopen(path, "rb");
        if (shoal_is_dir(path)) {
            snprintf(msg, sizeof msg, "is a directory, not a file");
        } else if (!f) {
            snprintf(msg, sizeof msg, "%s", errno == ENOENT ? "does not exist" : strerror(errno));
        } else {
            fclose(f);
            /* jansson's text may quote the file's bytes: printable ones only */
            char text[sizeof jerr.text];
            size_t n = 0;
            for (const char *c = jerr.text; *c && n + 1 < sizeof text; c++)
                text[n++] = (unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f ? *c : '?';
            text[n] = '\0';
            snprintf(msg, sizeof msg, "not readable JSON (line %d: %s)", jerr.line, text);
        }
        *why = msg;
        return NULL;
    }
    json_t *rows = json_object_get(r, "counts");
    int synth = 0;
    if (!json_is_array(rows) && json_is_array(json_object_get(r, "layers"))) {
        rows = json_object_get(r, "layers");
        synth = 1;
    }
    if (!r || !json_is_array(rows)) {
        *why = "neither a routing_counts.json (\"counts\") nor a synth.json (\"layers\")";
        json_decref(r);
        return NULL;
    }
    const int64_t L = o->n_moe_layer, E = o->n_expert;
    double *sh = calloc((size_t)(L > 0 && E > 0 ? L * E : 1), sizeof *sh);
    int64_t l = 0;
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        if (synth)
            row = json_object_get(row, "target_share");
        if (!json_is_array(row) || (int64_t)json_array_size(row) != E) {
            *why = "its rows do not have n_expert values";
            free(sh);
            json_decref(r);
            return NULL;
        }
        double sum = 0;
        for (int64_t e = 0; e < E; e++)
            sum += fmax(0, json_number_value(json_array_get(row, (size_t)e)));
        if (!(sum > 0) || l >= L)
            continue;
        for (int64_t e = 0; e < E; e++)
            sh[l * E + e] = fmax(0, json_number_value(json_array_get(row, (size_t)e))) / sum;
        l++;
    }
    json_decref(r);
    if (l == 0) {
        *why = "it holds no routings yet";
        free(sh);
        return NULL;
    }
    for (; l < L; l++)
        shoal_plan_default_shares(E, sh + l * E);
    return sh;
}

/* ---- output ---- */

static json_t *time_json(const struct shoal_plan_time *t)
{
    return json_pack("{s:f, s:s, s:{s:f, s:f, s:f, s:f, s:f}}", "seconds", t->total, "bound",
                     t->bound, "parts", "ram", t->ram, "disk", t->disk, "link", t->link,
                     "compute", t->compute, "fixed", t->fixed);
}

struct plan_ctx {
    const struct shoal_plan *o;
    const struct shoal_plan_params *p;
    struct shoal_plan_env env;
    int assumed_mem, assumed_disk, assumed_flops, assumed_link;
    const char *skew;         /* where the routing skew came from */
    const char *types;        /* a GGUF's types line, or NULL */
    int measured;             /* --measure ran */
    const char *model;
    char advice[256];
    double advice_tps;
};

/* The one change that helps decode most, by predicting each. */
static void advise(struct plan_ctx *c, const struct shoal_plan_speed *base)
{
    struct shoal_err err = {0};
    const struct shoal_plan_env *e0 = &c->env;
    if (!base->fits) {
        const struct shoal_plan_mem *m = &base->mem[0];
        uint64_t need = m->trunk + m->kv + m->reserve + m->staging;
        if (m->ram < need) {
            /* name the part that is largest: the trunk, the KV budget or the
             * reserve for the rest of the process */
            const char *part = m->reserve >= m->trunk && m->reserve >= m->kv
                                   ? "a smaller --reserve (what the OS and the rest of "
                                     "the process keep)"
                               : m->trunk >= m->kv ? "a smaller trunk (--dense int4a8)"
                                                   : "a smaller KV budget (--ctx)";
            snprintf(c->advice, sizeof c->advice, "machine 1 needs %.2f GiB more RAM, or %s",
                     (double)(need - m->ram) / (1 << 30), part);
        } else {
            snprintf(c->advice, sizeof c->advice, "give every machine at least %.1f GiB",
                     (double)(base->mem[1].reserve + base->mem[1].staging) / (1 << 30) + 0.1);
        }
        c->advice_tps = 0;
        return;
    }
    struct cand {
        char what[128];
        struct shoal_plan_env env;
    } cands[4];
    int nc = 0;
    /* twice the RAM on every machine */
    cands[nc].env = *e0;
    for (int m = 0; m < e0->n_machine; m++)
        cands[nc].env.m[m].ram *= 2;
    snprintf(cands[nc++].what, 128, "twice the RAM on %s",
             e0->n_machine > 1 ? "every machine" : "this machine");
    /* one more machine like the last */
    if (e0->n_machine < SHOAL_PLAN_MAX_MACHINES) {
        cands[nc].env = *e0;
        cands[nc].env.m[e0->n_machine] = e0->m[e0->n_machine - 1];
        cands[nc].env.n_machine++;
        snprintf(cands[nc++].what, 128, "a%s machine like machine %d%s",
                 e0->n_machine > 1 ? "nother" : " second", e0->n_machine,
                 e0->n_machine > 1 ? "" : " as an expert worker");
    }
    /* a disk twice as fast everywhere */
    cands[nc].env = *e0;
    for (int m = 0; m < e0->n_machine; m++)
        cands[nc].env.m[m].disk_bw = (e0->m[m].disk_bw > 0 ? e0->m[m].disk_bw : 3e9) * 2;
    snprintf(cands[nc++].what, 128, "disks twice as fast");
    if (e0->n_machine > 1) {
        cands[nc].env = *e0;
        cands[nc].env.link_bw *= 10;
        for (int m = 0; m < e0->n_machine; m++)
            cands[nc].env.m[m].link_bw *= 10;
        snprintf(cands[nc].what, 128, "links 10x as fast");
        nc++;
    }
    double best = base->decode_tps;
    c->advice[0] = 0;
    c->advice_tps = 0;
    struct shoal_plan_speed *sp = malloc(sizeof *sp);
    for (int i = 0; sp && i < nc; i++) {
        if (shoal_plan_speed(c->o, c->p, &cands[i].env, sp, &err) || !sp->fits)
            continue;
        if (sp->decode_tps > best * 1.05) {
            best = sp->decode_tps;
            snprintf(c->advice, sizeof c->advice, "%.127s", cands[i].what);
            c->advice_tps = sp->decode_tps;
        }
    }
    free(sp);
}

static json_t *speed_json(const struct plan_ctx *c, const struct shoal_plan_speed *s)
{
    json_t *j = json_object();
    json_object_set_new(j, "verdict", json_string(s->fits ? "runs" : "does not fit"));
    if (!s->fits)
        json_object_set_new(j, "reason", json_string(s->reason));
    json_t *ms = json_array();
    for (int m = 0; m < s->n_machine; m++) {
        const struct shoal_plan_mem *mm = &s->mem[m];
        const struct shoal_plan_machine *pm = &c->env.m[m];
        json_array_append_new(ms, json_pack(
            "{s:i, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f}",
            "machine", m + 1, "role", m == 0 ? "coordinator" : "expert worker",
            "serves_experts", mm->serves, "ram_bytes", (json_int_t)mm->ram,
            "reserve_bytes", (json_int_t)mm->reserve, "trunk_bytes", (json_int_t)mm->trunk,
            "kv_bytes", (json_int_t)mm->kv, "staging_bytes", (json_int_t)mm->staging,
            "expert_cache_bytes", (json_int_t)mm->cache,
            "experts_held", (json_int_t)mm->held, "experts_cached", (json_int_t)mm->cache_experts,
            "hit_rate", mm->hit, "mem_bw", pm->mem_bw > 0 ? pm->mem_bw : 50e9,
            "disk_bw", pm->disk_bw > 0 ? pm->disk_bw : 3e9,
            "flops", pm->flops > 0 ? pm->flops : 300e9));
    }
    json_object_set_new(j, "machines", ms);
    if (c->env.n_machine > 1)
        json_object_set_new(j, "link", json_pack("{s:f, s:f}", "bytes_per_s", c->env.link_bw,
                                                 "rtt_s", c->env.link_rtt));
    for (int m = 0; m < s->n_machine && c->env.n_machine > 1; m++)
        json_object_set_new(json_array_get(ms, (size_t)m), "link_bw",
                            json_real(c->env.m[m].link_bw > 0 ? c->env.m[m].link_bw
                                                              : c->env.link_bw));
    json_t *as = json_array();
    if (c->assumed_mem)
        json_array_append_new(as, json_string("mem_bw"));
    if (c->assumed_disk)
        json_array_append_new(as, json_string("disk_bw"));
    if (c->assumed_flops)
        json_array_append_new(as, json_string("flops"));
    if (c->assumed_link && c->env.n_machine > 1)
        json_array_append_new(as, json_string("link"));
    json_object_set_new(j, "assumed", as);
    json_object_set_new(j, "routing_skew", json_string(c->skew));
    json_object_set_new(j, "prompt", json_integer(c->env.prompt));
    if (s->fits) {
        json_object_set_new(j, "hit_rate", json_real(s->hit));
        json_object_set_new(j, "token_disk_bytes", json_integer((json_int_t)s->token_disk_bytes));
        json_object_set_new(j, "token_link_bytes", json_integer((json_int_t)s->token_link_bytes));
        json_object_set_new(j, "round_trips", json_real(s->round_trips));
        json_object_set_new(j, "decode_tok_s", json_real(s->decode_tps));
        json_object_set_new(j, "prefill_tok_s", json_real(s->prefill_tps));
        json_object_set_new(j, "decode", time_json(&s->decode));
        json_object_set_new(j, "prefill", time_json(&s->prefill));
        json_object_set_new(j, "prefill_cold_tok_s", json_real(s->prefill_cold_tps));
        json_object_set_new(j, "prefill_cold", time_json(&s->prefill_cold));
    }
    json_object_set_new(j, "advice", c->advice[0] ? json_pack("{s:s, s:f}", "change", c->advice,
                                                             "decode_tok_s", c->advice_tps)
                                                  : json_null());
    return j;
}

/* A rate with 3 significant digits, never in exponent form. */
static const char *rate3(char *buf, double v)
{
    snprintf(buf, 32, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : v >= 1 ? "%.2f" : "%.3g", v);
    return buf;
}

/* Bytes as whole MiB for an --expert-cache flag, rounded up: rounded down,
 * the planned cache would not fit the experts it was planned for. */
static unsigned long long mib_up(uint64_t bytes)
{
    return (unsigned long long)((bytes + (1u << 20) - 1) >> 20);
}

static void print_speed(const struct plan_ctx *c, const struct shoal_plan_speed *s)
{
    struct human_bufs hb = {.n = 0};
    const struct shoal_plan_env *e = &c->env;
    printf("machines     %d: machine 1 runs the coordinator%s", e->n_machine,
           e->coordinator_experts ? (e->n_machine > 1 ? " and serves experts too" : " and its "
                                     "expert store") : ", the others serve the experts");
    if (e->n_machine > 1) {
        printf("; links");
        for (int m = 0; m < e->n_machine; m++)
            printf("%s %.3g", m ? "," : "",
                   (e->m[m].link_bw > 0 ? e->m[m].link_bw : e->link_bw) * 8 / 1e9);
        printf(" Gbit/s, %.2f ms round trip", e->link_rtt * 1e3);
    }
    printf("\n");
    for (int m = 0; m < s->n_machine; m++) {
        const struct shoal_plan_mem *mm = &s->mem[m];
        printf("memory %-5d %s RAM:", m + 1, H(mm->ram));
        if (m == 0)
            printf(" trunk %s + KV %s +", H(mm->trunk), H(mm->kv));
        printf(" reserve %s", H(mm->reserve));
        if (mm->serves && s->fits)
            printf(" + staging %s + expert cache %s (%llu of its %llu experts, %.1f %%; hit "
                   "rate %.1f %%)", H(mm->staging), H(mm->cache),
                   (unsigned long long)mm->cache_experts, (unsigned long long)mm->held,
                   mm->held ? 100.0 * (double)mm->cache_experts / (double)mm->held : 0,
                   100 * mm->hit);
        printf("\n");
    }
    if (!s->fits) {
        printf("verdict      does not fit: %s\n", s->reason);
        if (c->advice[0])
            printf("would help   %s\n", c->advice);
        return;
    }
    char t1[32], t2[32], t3[32];
    printf("verdict      runs: decode %s tok/s (bound: %s), prefill %s tok/s over a "
           "%lld-token prompt (bound: %s)\n", rate3(t1, s->decode_tps), s->decode.bound,
           rate3(t2, s->prefill_tps), (long long)e->prompt, s->prefill.bound);
    printf("decode       %.1f ms a token at %lld tokens of context: disk %.1f ms overlapping "
           "RAM %.1f + link %.1f + per-layer %.1f ms\n", s->decode.total * 1e3,
           (long long)e->prompt, s->decode.disk * 1e3, s->decode.ram * 1e3,
           s->decode.link * 1e3, s->decode.fixed * 1e3);
    printf("             hit rate %.1f %% (LRU, routing skew: %s); %s a token from disk",
           100 * s->hit, c->skew, H(s->token_disk_bytes));
    if (e->n_machine > 1)
        printf(", %s and %.0f round trips on the wire", H(s->token_link_bytes), s->round_trips);
    printf("\n");
    printf("prefill      %.2f s for %lld tokens: compute %.2f, disk %.2f, link %.2f s; the first "
           "prompt, caches empty: %s tok/s (bound: %s)\n", s->prefill.total,
           (long long)e->prompt, s->prefill.compute, s->prefill.disk, s->prefill.link,
           rate3(t3, s->prefill_cold_tps), s->prefill_cold.bound);
    if (c->assumed_mem || c->assumed_disk || c->assumed_flops ||
        (c->assumed_link && e->n_machine > 1)) {
        printf("assumed     ");
        char flags[96] = "";
        if (c->assumed_mem) {
            printf(" RAM read %.0f GB/s,", 50.0);
            strcat(flags, " --mem-bw,");
        }
        if (c->assumed_disk) {
            printf(" disk %.1f GB/s,", 3.0);
            strcat(flags, " --disk,");
        }
        if (c->assumed_flops) {
            printf(" GEMM %.0f GFLOP/s,", 300.0);
            strcat(flags, " --flops,");
        }
        if (c->assumed_link && e->n_machine > 1) {
            printf(" link 1 Gbit/s,");
            strcat(flags, " --link,");
        }
        size_t fl = strlen(flags);
        if (fl > 0 && flags[fl - 1] == ',')
            flags[fl - 1] = '\0';   /* the list's last comma */
        printf(" the defaults: give%s%s\n", flags,
               c->measured ? " (--measure could not probe these here)" : " or --measure here");
    }
    if (c->advice[0])
        printf("help most    %s: decode %s tok/s (%+.0f %%)\n", c->advice, rate3(t1, c->advice_tps),
               100 * (c->advice_tps / s->decode_tps - 1));
    const struct shoal_plan_mem *m0 = &s->mem[0];
    if (c->types && !c->o->runnable) {
        printf("note         shoal does not run this GGUF yet (an architecture or a tensor type "
               "it does not run: 'shoal inspect %s' says which; docs/MODELS.md); these "
               "figures are for the file as shipped, once it does\n", c->model);
        return;
    }
    struct stat st;
    char *man = shoal_path_join(c->model, "shoal.json");
    int container = stat(man, &st) == 0;
    free(man);
    int isdir = stat(c->model, &st) == 0 && S_ISDIR(st.st_mode);
    if (!container && !c->types) {   /* a GGUF runs as it is: its experts streamed */
        char ex[16], de[16];
        snprintf(ex, sizeof ex, "%s", shoal_dtype_name(c->p->experts_dtype));
        snprintf(de, sizeof de, "%s", shoal_dtype_name(c->p->dense_dtype));
        for (char *q = ex; *q; q++)
            *q = (char)tolower((unsigned char)*q);
        for (char *q = de; *q; q++)
            *q = (char)tolower((unsigned char)*q);
        printf("convert      shoal convert %s DIR --experts %s --dense %s\n",
               isdir ? c->model : "CHECKPOINT", ex, de);
    }
    const char *dir = container || c->types ? c->model : "DIR";
    if (e->n_machine == 1) {
        printf("run with     shoal run %s --prompt TEXT --expert-cache %lluM --direct on\n", dir,
               mib_up(m0->cache));
        return;
    }
    const int nw = e->n_machine - 1;
    printf("run with     machine 1: shoal run %s --prompt TEXT", dir);
    if (m0->serves)
        printf(" --expert-cache %lluM --direct on", mib_up(m0->cache));
    printf(" --workers HOST2:7070%s%s\n", nw > 1 ? ",..." : "",
           e->coordinator_experts ? "" : " --local-experts off");
    const unsigned long long wc = mib_up(s->mem[s->n_machine - 1].cache);
    if (nw == 1)
        printf("             machine 2: shoal-worker --model %s --expert-cache %lluM --direct on "
               "--listen ADDR:7070\n", dir, wc);
    else
        printf("             machine I+1 (I = 1..%d): shoal-worker --model %s --shard I-1/%d "
               "--expert-cache %lluM --direct on --listen ADDR:7070\n", nw, dir, nw, wc);
}

/* A GGUF file: its name ends in .gguf or its first bytes are "GGUF". */
static int is_gguf(const char *path)
{
    size_t n = strlen(path);
    if (n > 5 && !strcasecmp(path + n - 5, ".gguf"))
        return 1;
    FILE *f = fopen(path, "rb");
    char m[4] = {0};
    int yes = f && fread(m, 1, 4, f) == 4 && !memcmp(m, "GGUF", 4);
    if (f)
        fclose(f);
    return yes;
}

int shoal_cmd_plan(int argc, char **argv)
{
    struct shoal_plan_params p = {.experts_dtype = SHOAL_DTYPE_BF16,
                                  .dense_dtype = SHOAL_DTYPE_BF16, .group = 64};
    struct plan_ctx c = {.p = &p, .env = {.coordinator_experts = 1, .prompt = 512,
                                          .link_bw = 1e9 / 8, .link_rtt = 0.2e-3}};
    const char *model = NULL, *routing = NULL;
    int as_json = 0, measure = 0, set_experts = 0, set_dense = 0, set_group = 0, set_kv = 0;
    int set_prompt = 0;
    long long machines = 0;
    double ram[SHOAL_PLAN_MAX_MACHINES], disk[SHOAL_PLAN_MAX_MACHINES],
        mem[SHOAL_PLAN_MAX_MACHINES], flops[SHOAL_PLAN_MAX_MACHINES],
        link[SHOAL_PLAN_MAX_MACHINES];
    int n_ram = 0, n_disk = 0, n_mem = 0, n_flops = 0, n_link = 0, set_link = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plan_usage();
            return 0;
        }
        if (!strcmp(a, "--json") || !strcmp(a, "--measure")) {
            *(a[2] == 'j' ? &as_json : &measure) = 1;
            continue;
        }
        if (!strcmp(a, "--workers")) {
            shoal_cli_error("plan: --workers is a list of worker addresses (run, chat, serve); "
                            "give the number of machines with --machines N");
            return 2;
        }
        if (!strcmp(a, "--hit-rate")) {
            shoal_cli_error("plan: --hit-rate is no longer taken: the planner derives it from "
                            "the cache each --ram leaves and the routing skew (--routing FILE)");
            return 2;
        }
        static const char *const valued[] = {
            "--model", "--experts", "--dense", "--group", "--ram", "--ctx", "--machines",
            "--kv", "--disk", "--mem-bw", "--flops", "--link", "--rtt",
            "--coordinator-experts", "--prompt", "--reserve", "--routing"};
        int k = -1;
        for (int j = 0; j < (int)(sizeof valued / sizeof valued[0]); j++)
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
            shoal_cli_error("plan: %s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        long long n;
        int bad = 0;
        switch (k) {
        case 0: bad = shoal_cli_take_path("plan", "model", v, &model) < 0; break;
        case 1: bad = shoal_cli_parse_dtype(a, v, &p.experts_dtype); set_experts = 1; break;
        case 2: bad = shoal_cli_parse_dtype(a, v, &p.dense_dtype); set_dense = 1; break;
        case 3: bad = shoal_cli_parse_group(a, v, &p.group); set_group = 1; break;
        case 4: bad = (n_ram = parse_list(a, v, L_SIZE, ram)) < 0; break;
        case 5: bad = shoal_cli_parse_i64(a, v, 1, 1ll << 24, &n); p.ctx = n; break;
        case 6: bad = shoal_cli_parse_i64(a, v, 1, SHOAL_PLAN_MAX_MACHINES, &machines); break;
        case 7: bad = shoal_cli_parse_kv(a, v, &p.kv_dtype); set_kv = 1; break;
        case 8: bad = (n_disk = parse_list(a, v, L_RATE, disk)) < 0; break;
        case 9: bad = (n_mem = parse_list(a, v, L_RATE, mem)) < 0; break;
        case 10: bad = (n_flops = parse_list(a, v, L_FLOPS, flops)) < 0; break;
        case 11: bad = (n_link = parse_list(a, v, L_LINK, link)) < 0; set_link = 1; break;
        case 12: bad = parse_time(a, v, &c.env.link_rtt); break;
        case 13:
            if (!strcmp(v, "on") || !strcmp(v, "off"))
                c.env.coordinator_experts = !strcmp(v, "on");
            else {
                shoal_cli_error("plan: --coordinator-experts expects on or off, got '%s'", v);
                bad = 1;
            }
            break;
        case 14:
            bad = shoal_cli_parse_i64(a, v, 1, 1ll << 24, &n);
            c.env.prompt = n;
            set_prompt = 1;
            break;
        case 15: {
            uint64_t r;
            bad = parse_size_unit(a, v, &r);
            c.env.reserve = r;
            break;
        }
        case 16: routing = v; break;
        }
        if (bad)
            return 2;
    }
    if (!model) {
        shoal_cli_error("plan: usage: shoal plan MODEL [options] (missing the model: a "
                        "config.json, checkpoint or container directory)");
        return 2;
    }
    /* the machine count: --machines, or the longest list; every list has
     * one value (for all) or one per machine */
    int M = machines ? (int)machines : 1;
    const int lens[5] = {n_ram, n_disk, n_mem, n_flops, n_link};
    const char *const lflag[5] = {"--ram", "--disk", "--mem-bw", "--flops", "--link"};
    for (int i = 0; i < 5; i++)
        if (!machines && lens[i] > M)
            M = lens[i];
    for (int i = 0; i < 5; i++)
        if (lens[i] > 1 && lens[i] != M) {
            shoal_cli_error("plan: %s lists %d machines but there are %d (%s); give one value "
                            "for all or one per machine", lflag[i], lens[i], M,
                            machines ? "--machines" : "the longest list");
            return 2;
        }
    if (!c.env.coordinator_experts && M < 2) {
        shoal_cli_error("plan: --coordinator-experts off needs a second machine to serve the "
                        "experts (--machines 2 or more)");
        return 2;
    }
    c.env.n_machine = M;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    for (int m = 0; m < M; m++) {
        c.env.m[m].ram = n_ram ? (uint64_t)ram[n_ram > 1 ? m : 0]
                               : (uint64_t)pages * (uint64_t)psz;
        c.env.m[m].disk_bw = n_disk ? disk[n_disk > 1 ? m : 0] : 0;
        c.env.m[m].mem_bw = n_mem ? mem[n_mem > 1 ? m : 0] : 0;
        c.env.m[m].flops = n_flops ? flops[n_flops > 1 ? m : 0] : 0;
        c.env.m[m].link_bw = n_link ? link[n_link > 1 ? m : 0] : 0;
    }
    char *text = NULL, *what = NULL;
    size_t len = 0;
    int rc = 0;
    struct shoal_err err = {0};
    struct shoal_plan o;
    char types[512] = "";
    if (is_gguf(model)) {
        /* a GGUF: every tensor at its shipped type; the dtype flags do not
         * apply (contract 2: precision belongs to the model file) */
        if (set_experts || set_dense || set_group) {
            shoal_cli_error("plan: %s is a GGUF: its tensors are planned at the types they "
                            "ship in; --experts, --dense and --group do not apply", model);
            return 2;
        }
        if (shoal_plan_gguf(model, &p, &o, types, sizeof types, &err)) {
            shoal_cli_error("plan: %s", err.msg);
            return 2;
        }
        what = shoal_xstrdup(model);
        goto planned;
    }
    rc = load_config(model, &text, &len, &what);
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
    if (shoal_plan_config(text, len, what, &p, &o, &err)) {
        shoal_cli_error("plan: %s", err.msg);
        free(text);
        free(what);
        return 2;
    }
planned:
    /* the prompt fits the KV budget: the default shrinks to it, a --prompt
     * beyond it is a contradiction */
    if (c.env.prompt > o.ctx) {
        if (set_prompt) {
            shoal_cli_error("plan: --prompt %lld exceeds the KV cache budget of %lld tokens "
                            "(--ctx)", (long long)c.env.prompt, (long long)o.ctx);
            free(text);
            free(what);
            return 2;
        }
        c.env.prompt = o.ctx;
    }
    c.o = &o;
    c.types = types[0] ? types : NULL;
    c.model = model;
    /* the routing skew: --routing, the container's counts, a synthetic
     * container's target shares, or the curve */
    double *shares = NULL;
    c.skew = "default curve fitted to OLMoE routing traces";
    struct stat st;
    int isdir = stat(model, &st) == 0 && S_ISDIR(st.st_mode);
    const char *const own[2] = {"routing_counts.json", "synth.json"};
    const char *const own_what[2] = {"the container's routing counts",
                                     "the synthetic container's target shares"};
    for (int w = routing ? -1 : 0; w < (isdir ? 2 : 0) && !shares; w++) {
        char *rpath = w < 0 ? shoal_xstrdup(routing) : shoal_path_join(model, own[w]);
        if (w >= 0 && !shoal_exists(rpath)) {
            free(rpath);
            continue;
        }
        const char *why = NULL;
        shares = load_shares(rpath, &o, &why);
        if (!shares && w < 0) {
            shoal_cli_error("plan: --routing %s: %s", routing, why ? why : "unreadable");
            free(rpath), free(text), free(what);
            return 2;
        }
        if (shares)
            c.skew = w < 0 ? "the --routing file" : own_what[w];
        else
            fprintf(stderr, "shoal: plan: %s not used: %s\n", rpath, why);
        free(rpath);
        if (w < 0)
            break;
    }
    c.env.shares = shares;
    /* --measure: this machine's RAM, GEMM rate and disk, for machines whose
     * values were not given */
    if (measure) {
        fprintf(stderr, "shoal: plan: measuring this machine (RAM read, GEMM, disk)...\n");
        struct shoal_bench_ram_params rp = {.threads = 0, .array_mib = 512, .reps = 5};
        json_t *rj = shoal_bench_ram(&rp);
        double rd = json_number_value(json_object_get(rj, "read_gbs")) * 1e9;
        json_decref(rj);
        double fl = measure_flops(p.experts_dtype, p.group);
        double dk = 0;
        char *ex = stat(model, &st) == 0 && S_ISDIR(st.st_mode)
                       ? shoal_path_join(model, "experts.bin") : NULL;
        if (ex && stat(ex, &st) == 0 && S_ISREG(st.st_mode) &&
            (uint64_t)st.st_size > 4 * o.expert_blob_bytes) {
            struct shoal_bench_fio_params fp = {.path = ex, .offset = 0,
                                                .size = (uint64_t)st.st_size,
                                                .bs = o.expert_blob_bytes,
                                                .iodepth = SHOAL_PLAN_QUEUE_DEPTH,
                                                .runtime_s = 2};
            json_t *fj = shoal_bench_fio(&fp);
            dk = json_number_value(json_object_get(fj, "mb_per_s")) * 1e6;
            json_decref(fj);
        }
        free(ex);
        for (int m = 0; m < M; m++) {
            if (!n_mem && rd > 0)
                c.env.m[m].mem_bw = rd;
            if (!n_flops && fl > 0)
                c.env.m[m].flops = fl;
            if (!n_disk && dk > 0)
                c.env.m[m].disk_bw = dk;
        }
        char gemm[64];
        if (fl > 0)
            snprintf(gemm, sizeof gemm, "GEMM %.0f GFLOP/s", fl / 1e9);
        else
            snprintf(gemm, sizeof gemm, "GEMM not measured (no probe for %s experts)",
                     c.types ? "GGUF" : shoal_dtype_name(p.experts_dtype));
        fprintf(stderr, "shoal: plan: measured RAM read %.1f GB/s, %s, disk %s\n", rd / 1e9,
                gemm, dk > 0 ? "measured" : "not measured (no experts.bin here)");
        c.measured = 1;
        if (dk > 0)
            fprintf(stderr, "shoal: plan: disk %.2f GB/s (fio random reads of one expert)\n",
                    dk / 1e9);
    }
    c.assumed_mem = c.env.m[0].mem_bw <= 0;
    c.assumed_disk = c.env.m[0].disk_bw <= 0;
    c.assumed_flops = c.env.m[0].flops <= 0;
    c.assumed_link = !set_link;
    struct shoal_plan_speed *sp = calloc(1, sizeof *sp);
    if (!sp || shoal_plan_speed(&o, &p, &c.env, sp, &err)) {
        shoal_cli_error("plan: %s", sp ? err.msg : "out of memory");
        rc = 2;
    } else {
        advise(&c, sp);
        if (as_json) {
            print_json(&o, &p, what, c.types, speed_json(&c, sp));
        } else {
            print_text(&o, &p, what, c.types);
            print_speed(&c, sp);
        }
        rc = sp->fits ? 0 : 3;
    }
    free(sp);
    free(shares);
    free(text);
    free(what);
    return rc;
}
