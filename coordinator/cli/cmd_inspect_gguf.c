/* shoal inspect FILE.gguf: what a GGUF model holds (architecture, tensor
 * groups with their ggml types and bytes, the routed experts' bytes per
 * expert) and which of its types shoal can run. Table or --json. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ggml_dot.h"
#include "ggml_types.h"
#include "gguf.h"
#include "gguf_arch.h"
#include "quant.h"

/* Tensor groups, in the order printed. */
enum group {
    G_EMBED, G_ATTN, G_ROUTER, G_EXPS, G_SHEXP, G_FFN, G_NORM, G_OUTPUT, G_OTHER, G_COUNT
};
static const char *const group_names[G_COUNT] = {
    "token_embd", "attention (attn_*)", "router (ffn_gate_inp)",
    "routed experts (ffn_*_exps)", "shared experts (ffn_*_shexp)", "dense ffn (ffn_*)",
    "norms", "output", "other"};
static const char *const group_keys[G_COUNT] = {
    "token_embd", "attention", "router", "routed_experts", "shared_experts", "dense_ffn",
    "norms", "output", "other"};

static int has_suffix(const char *s, size_t n, const char *suf)
{
    size_t k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

/* The group of a llama.cpp tensor name ("blk.3.ffn_up_exps.weight"); *layer
 * is the block number or -1. */
static enum group classify(const char *name, long *layer)
{
    *layer = -1;
    const char *base = name;
    if (!strncmp(name, "blk.", 4)) {
        char *end;
        long il = strtol(name + 4, &end, 10);
        if (end != name + 4 && *end == '.') {
            *layer = il;
            base = end + 1;
        }
    }
    size_t n = strlen(base);
    if (has_suffix(base, n, ".weight"))
        n -= 7;
    else if (has_suffix(base, n, ".bias"))
        n -= 5;
    char b[128];
    snprintf(b, sizeof b, "%.*s", (int)(n < sizeof b ? n : sizeof b - 1), base);
    if (!strcmp(b, "token_embd"))
        return G_EMBED;
    if (!strcmp(b, "output"))
        return G_OUTPUT;
    if (strstr(b, "norm"))
        return G_NORM;
    if (!strncmp(b, "ffn_gate_inp", 12) && !strstr(b, "shexp"))
        return G_ROUTER;
    if (!strcmp(b, "exp_probs_b"))
        return G_ROUTER;
    if (!strncmp(b, "ffn_", 4) && has_suffix(b, strlen(b), "_exps"))
        return G_EXPS;
    if (!strncmp(b, "ffn_", 4) && strstr(b, "shexp"))
        return G_SHEXP;
    if (!strncmp(b, "ffn_", 4))
        return G_FFN;
    if (!strncmp(b, "attn_", 5))
        return G_ATTN;
    return G_OTHER;
}

struct tally {
    uint64_t tensors, bytes;
};

struct summary {
    struct tally group[G_COUNT][SHOAL_GGML_TYPE_COUNT];
    struct tally type[SHOAL_GGML_TYPE_COUNT];
    uint64_t n_tensors, bytes;
    /* bytes of one expert (all its *_exps tensors) per layer; [n_layer] */
    uint64_t *expert_bytes;
    long n_layer;
    int64_t n_expert;    /* the expert dimension seen, or 0 */
    int mixed_experts;   /* expert tensors disagree on the expert count */
};

static void add_tensor(struct summary *s, const struct shoal_gguf_tensor *t)
{
    long il;
    enum group g = classify(t->name, &il);
    s->group[g][t->type].tensors++;
    s->group[g][t->type].bytes += t->nbytes;
    s->type[t->type].tensors++;
    s->type[t->type].bytes += t->nbytes;
    s->n_tensors++;
    s->bytes += t->nbytes;
    if (g != G_EXPS || il < 0 || il > 65535 || t->n_dims < 2)
        return; /* (a block number past 65535 is no real layer) */
    /* the expert index is the slowest dimension: one expert is 1/ne[last] */
    int64_t ne_exp = (int64_t)t->ne[t->n_dims - 1];
    if (ne_exp <= 0)
        return;
    if (s->n_expert && s->n_expert != ne_exp)
        s->mixed_experts = 1;
    s->n_expert = ne_exp;
    if (il >= s->n_layer) {
        long n = il + 1;
        s->expert_bytes = realloc(s->expert_bytes, (size_t)n * sizeof *s->expert_bytes);
        if (!s->expert_bytes) {
            fprintf(stderr, "shoal: out of memory\n");
            exit(1);
        }
        memset(s->expert_bytes + s->n_layer, 0, (size_t)(n - s->n_layer) * sizeof *s->expert_bytes);
        s->n_layer = n;
    }
    s->expert_bytes[il] += t->nbytes / (uint64_t)ne_exp;
}

/* Whether `shoal run` computes with type id today (model_gguf.c): F32,
 * F16 and BF16 as shoal's own dtypes, the types with a dot product
 * (shoal_ggml_dot_supported) through ggml_dot.h's kernels. */
static int type_runs(uint32_t id)
{
    return id == SHOAL_GGML_TYPE_F32 || id == SHOAL_GGML_TYPE_F16 ||
           id == SHOAL_GGML_TYPE_BF16 || shoal_ggml_dot_supported(id);
}

/* What shoal does with a type today, on this CPU's kernels: the active
 * table's name (shoal_quant_ops_name: avx2, avx512-zen4, neon-dotprod,
 * ...) when it has ggml rows, else the scalar reference. */
static const char *type_status(uint32_t id, const struct shoal_ggml_type_info *t)
{
    static char buf[96];
    if (type_runs(id)) {
        if (id == SHOAL_GGML_TYPE_F32 || id == SHOAL_GGML_TYPE_F16 ||
            id == SHOAL_GGML_TYPE_BF16)
            return "runs";
        if (!shoal_quant_active_ops()->ggml_rows)
            return "runs (scalar kernels: no SIMD ones for it on this CPU yet)";
        snprintf(buf, sizeof buf, "runs (%s kernels)", shoal_quant_ops_name());
        return buf;
    }
    return t->dequant ? "dequant reference only (does not run yet)"
                      : "not supported (no dequantization yet)";
}

/* Distinct per-expert sizes with the number of layers of each. */
struct size_count {
    uint64_t bytes;
    long layers;
};

static int expert_sizes(const struct summary *s, struct size_count *out, int cap)
{
    int n = 0;
    for (long il = 0; il < s->n_layer; il++) {
        uint64_t b = s->expert_bytes[il];
        if (!b)
            continue;
        int k = 0;
        while (k < n && out[k].bytes != b)
            k++;
        if (k == n) {
            if (n == cap)
                continue;
            out[n++] = (struct size_count){b, 0};
        }
        out[k].layers++;
    }
    return n;
}

static const char *meta_str(const struct shoal_gguf *g, const char *key)
{
    const char *v;
    if (shoal_gguf_get_str(g, key, &v, NULL, NULL) == 0)
        return v;
    return NULL;
}

/* {arch}.key as an integer, or -1. */
static int64_t arch_int(const struct shoal_gguf *g, const char *arch, const char *key)
{
    char k[256];
    int64_t v;
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return shoal_gguf_get_int(g, k, &v, NULL) == 0 ? v : -1;
}

static void print_table(const char *path, const struct shoal_gguf_files *f,
                        const struct summary *s)
{
    const struct shoal_gguf *g0 = shoal_gguf_files_get(f, 0);
    const char *arch = meta_str(g0, "general.architecture");
    const char *name = meta_str(g0, "general.name");
    printf("gguf         %s (version %" PRIu32 ", %" PRIu32 " file%s, alignment %" PRIu64 ")\n",
           path, shoal_gguf_version(g0), shoal_gguf_files_count(f),
           shoal_gguf_files_count(f) == 1 ? "" : "s", shoal_gguf_alignment(g0));
    for (uint32_t i = 0; shoal_gguf_files_count(f) > 1 && i < shoal_gguf_files_count(f); i++)
        printf("  file %-5" PRIu32 " %s (%" PRIu64 " tensors)\n", i + 1, shoal_gguf_files_path(f, i),
               shoal_gguf_n_tensors(shoal_gguf_files_get(f, i)));
    printf("architecture %s%s%s%s\n", arch ? arch : "(no general.architecture)",
           name ? " (" : "", name ? name : "", name ? ")" : "");
    if (arch) {
        static const char *const keys[] = {"block_count", "embedding_length", "expert_count",
                                           "expert_used_count", "expert_feed_forward_length"};
        int shown = 0;
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
            int64_t v = arch_int(g0, arch, keys[i]);
            if (v >= 0)
                printf("%s%s %" PRId64, shown++ ? ", " : "metadata     ", keys[i], v);
        }
        if (shown)
            printf("\n");
    }
    char size[32];
    printf("tensors      %" PRIu64 ", %" PRIu64 " bytes (%s)\n", s->n_tensors, s->bytes,
           shoal_cli_format_bytes(size, sizeof size, (double)s->bytes));
    printf("\n%-30s %8s %16s  %s\n", "group", "tensors", "bytes", "types (tensors)");
    for (int gi = 0; gi < G_COUNT; gi++) {
        uint64_t nt = 0, nb = 0;
        for (int t = 0; t < SHOAL_GGML_TYPE_COUNT; t++)
            nt += s->group[gi][t].tensors, nb += s->group[gi][t].bytes;
        if (!nt)
            continue;
        printf("%-30s %8" PRIu64 " %16" PRIu64 " ", group_names[gi], nt, nb);
        for (int t = 0, first = 1; t < SHOAL_GGML_TYPE_COUNT; t++)
            if (s->group[gi][t].tensors) {
                printf("%s %s x%" PRIu64, first ? "" : ",", shoal_ggml_type_name((uint32_t)t),
                       s->group[gi][t].tensors);
                first = 0;
            }
        printf("\n");
    }
    printf("%-30s %8" PRIu64 " %16" PRIu64 "\n", "total", s->n_tensors, s->bytes);
    struct size_count sizes[8];
    int ns = expert_sizes(s, sizes, 8);
    if (ns) {
        printf("\nexperts      %" PRId64 " per layer%s; one expert (its ffn_*_exps slices, "
               "contiguous in each tensor):\n",
               s->n_expert, s->mixed_experts ? " (tensors disagree on the count)" : "");
        for (int i = 0; i < ns; i++)
            printf("  %" PRIu64 " bytes (%s) in %ld layer%s\n", sizes[i].bytes,
                   shoal_cli_format_bytes(size, sizeof size, (double)sizes[i].bytes),
                   sizes[i].layers, sizes[i].layers == 1 ? "" : "s");
    }
    printf("\n%-8s %8s %16s  %s\n", "type", "tensors", "bytes", "in shoal on this CPU");
    for (int t = 0; t < SHOAL_GGML_TYPE_COUNT; t++)
        if (s->type[t].tensors)
            printf("%-8s %8" PRIu64 " %16" PRIu64 "  %s\n", shoal_ggml_type_name((uint32_t)t),
                   s->type[t].tensors, s->type[t].bytes,
                   type_status((uint32_t)t, shoal_ggml_type_info((uint32_t)t)));
    int all_run = 1;
    for (int t = 0; t < SHOAL_GGML_TYPE_COUNT; t++)
        if (s->type[t].tensors && !type_runs((uint32_t)t))
            all_run = 0;
    if (arch && shoal_gguf_arch_find(arch) && all_run)
        printf("\nshoal run takes this file (%s; its experts are streamed from the file by "
               "the expert store: docs/MODELS.md).\n", arch);
    else
        printf("\nshoal run does not take this file yet: it runs GGUF files of %s with F32, "
               "F16 and BF16 tensors and matrices of %s (docs/MODELS.md).\n",
               shoal_gguf_arch_list(), shoal_ggml_dot_types());
}

static void print_json(const char *path, const struct shoal_gguf_files *f,
                       const struct summary *s)
{
    const struct shoal_gguf *g0 = shoal_gguf_files_get(f, 0);
    const char *arch = meta_str(g0, "general.architecture");
    json_t *root = json_object();
    json_object_set_new(root, "path", json_string(path));
    json_object_set_new(root, "format", json_string("gguf"));
    json_object_set_new(root, "version", json_integer(shoal_gguf_version(g0)));
    json_object_set_new(root, "alignment", json_integer((json_int_t)shoal_gguf_alignment(g0)));
    json_t *files = json_array();
    for (uint32_t i = 0; i < shoal_gguf_files_count(f); i++)
        json_array_append_new(files, json_string(shoal_gguf_files_path(f, i)));
    json_object_set_new(root, "files", files);
    json_object_set_new(root, "architecture", arch ? json_string(arch) : json_null());
    json_object_set_new(root, "n_tensors", json_integer((json_int_t)s->n_tensors));
    json_object_set_new(root, "bytes", json_integer((json_int_t)s->bytes));
    json_t *groups = json_array();
    for (int gi = 0; gi < G_COUNT; gi++) {
        uint64_t nt = 0, nb = 0;
        json_t *types = json_object();
        for (int t = 0; t < SHOAL_GGML_TYPE_COUNT; t++) {
            const struct tally *c = &s->group[gi][t];
            if (!c->tensors)
                continue;
            nt += c->tensors, nb += c->bytes;
            json_t *o = json_object();
            json_object_set_new(o, "tensors", json_integer((json_int_t)c->tensors));
            json_object_set_new(o, "bytes", json_integer((json_int_t)c->bytes));
            json_object_set_new(types, shoal_ggml_type_name((uint32_t)t), o);
        }
        if (!nt) {
            json_decref(types);
            continue;
        }
        json_t *o = json_object();
        json_object_set_new(o, "group", json_string(group_keys[gi]));
        json_object_set_new(o, "tensors", json_integer((json_int_t)nt));
        json_object_set_new(o, "bytes", json_integer((json_int_t)nb));
        json_object_set_new(o, "types", types);
        json_array_append_new(groups, o);
    }
    json_object_set_new(root, "groups", groups);
    struct size_count sizes[8];
    int ns = expert_sizes(s, sizes, 8);
    json_t *ex = json_object();
    json_object_set_new(ex, "n_expert", json_integer((json_int_t)s->n_expert));
    json_t *per = json_array();
    for (int i = 0; i < ns; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "bytes", json_integer((json_int_t)sizes[i].bytes));
        json_object_set_new(o, "layers", json_integer(sizes[i].layers));
        json_array_append_new(per, o);
    }
    json_object_set_new(ex, "bytes_per_expert", per);
    json_object_set_new(root, "experts", ex);
    json_t *types = json_array();
    for (int t = 0; t < SHOAL_GGML_TYPE_COUNT; t++) {
        if (!s->type[t].tensors)
            continue;
        const struct shoal_ggml_type_info *ti = shoal_ggml_type_info((uint32_t)t);
        json_t *o = json_object();
        json_object_set_new(o, "type", json_string(ti->name));
        json_object_set_new(o, "id", json_integer(t));
        json_object_set_new(o, "tensors", json_integer((json_int_t)s->type[t].tensors));
        json_object_set_new(o, "bytes", json_integer((json_int_t)s->type[t].bytes));
        json_object_set_new(o, "native", json_boolean(type_runs((uint32_t)t)));
        json_object_set_new(o, "dequant_reference", json_boolean(ti->dequant != NULL));
        json_array_append_new(types, o);
    }
    json_object_set_new(root, "types", types);
    json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("\n");
    json_decref(root);
}

int shoal_cli_inspect_gguf(const char *path, int json)
{
    struct shoal_err err = {0};
    shoal_quant_init(SHOAL_QUANT_ISA_AUTO, &err);   /* the kernels it would run with */
    err = (struct shoal_err){0};
    struct shoal_gguf_files *f = shoal_gguf_files_open(path, &err);
    if (!f) {
        shoal_cli_error("%s", err.msg);
        /* a file that is no valid GGUF is bad input, as for run and plan */
        return shoal_err_is_bad_input(err.code) ? 2 : 1;
    }
    struct summary *s = calloc(1, sizeof *s);
    if (!s) {
        shoal_gguf_files_close(f);
        shoal_cli_error("out of memory");
        return 1;
    }
    for (uint32_t i = 0; i < shoal_gguf_files_count(f); i++) {
        const struct shoal_gguf *g = shoal_gguf_files_get(f, i);
        for (uint64_t j = 0; j < shoal_gguf_n_tensors(g); j++) {
            struct shoal_gguf_tensor t;
            shoal_gguf_tensor(g, j, &t);
            add_tensor(s, &t);
        }
    }
    if (json)
        print_json(path, f, s);
    else
        print_table(path, f, s);
    free(s->expert_bytes);
    free(s);
    shoal_gguf_files_close(f);
    return 0;
}
