/* shoal bench: one measured configuration (docs/BENCHMARKS.md "Sweeps").
 *
 * The parent process measures the physical limits (bench_probe.h), makes
 * the cold state, and runs each repetition in a forked child that opens
 * the model with the given flags, runs the prompts and hands its figures
 * back as JSON. A process per repetition, rather than N runs in one:
 *   - cold means empty expert caches and a fresh allocator: in one
 *     process, glibc keeps the first run's freed expert blobs (its mmap
 *     threshold rises after the first free), which made later "cold" runs
 *     up to 2x faster in the store benchmark (docs/BENCHMARKS_LOG.md, (c));
 *   - peak RSS (getrusage in the child) is that repetition's alone, not
 *     the RAM probe's 1.5 GB or an earlier repetition's;
 *   - a crash in one repetition is reported, and the others still count.
 * The parent never starts OpenMP threads, so forking is safe.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "bench_cluster.h"
#include "bench_commit.h"
#include "bench_probe.h"
#include "bench_tools.h"
#include "cli.h"
#include "config.h"
#include "container.h"
#include "expert_store.h"
#include "forward.h"
#include "ggml_types.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"
#include "model_config.h"
#include "quant.h"
#include "sampler.h"
#include "session.h"
#include "session_flags.h"
#include "util.h"

#define BENCH_SCHEMA "shoal-bench/1"

enum bench_state { BENCH_COLD = 0, BENCH_WARM = 1 };

struct bench_opts {
    struct shoal_session_opts so;
    const char *prompts_file;     /* NULL: random token prompts */
    long long prompt_len;         /* tokens per random prompt */
    long long n_prompts;          /* random prompts */
    long long gen;                /* tokens generated per prompt */
    long long reps;               /* measured repetitions */
    long long seed;               /* prompts and sampling */
    enum bench_state state;
    const char *limits;           /* "on", "off" or a JSON file */
    int limits_only;              /* 1: limits and machine only, no model run */
    double fio_runtime;           /* seconds */
    long long ram_mib;            /* each RAM probe array, MiB */
    long long ram_reps;           /* RAM probe repetitions (best kept) */
    int paired_ram;               /* a RAM probe after every repetition */
    const char *label;            /* --label, stored in the JSON */
    const char *json_out;         /* --json path or NULL */
};

/* the model, as the parent sees it: a container or a Hugging Face
 * directory without loading it; a GGUF file loaded once (memory-mapped,
 * the trunk's block scales checked) for its expert layout, then closed */
struct bench_model {
    int container;                /* 1: a shoal container; 0: a Hugging Face directory */
    int gguf;                     /* 1: a GGUF file, its experts streamed from it */
    struct shoal_model_config cfg;/* from the manifest (containers) or the GGUF */
    uint64_t fingerprint;
    char *experts_path;           /* the file fio reads: experts.bin, or the GGUF file
                                   * holding the most expert bytes (owned) */
    uint64_t experts_size;        /* end of the region fio reads, bytes (experts.bin's size) */
    uint64_t blob_bytes;          /* one fio request, bytes: an expert's blob, or a GGUF
                                   * expert matrix's mean page-rounded read */
    uint64_t first_blob;          /* start of the region fio reads, bytes */
    uint64_t compute_bytes;       /* one expert's bytes the FFN reads (a GGUF: the mean
                                   * over its MoE layers); 0: no expert store */
    int64_t n_moe_layer;
    const char *dtype;            /* expert dtype name, static */
    char **files;                 /* [n_files] a GGUF set's files, evicted for a cold
                                   * state (owned) */
    int n_files;
    char *dir;                    /* owned */
};

/* ---- small helpers ---------------------------------------------------------------- */

static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static void jset(json_t *o, const char *k, json_t *v)
{
    json_object_set_new(o, k, v ? v : json_null());
}

static double jget(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static double ratio(double a, double b)
{
    return isfinite(a) && isfinite(b) && b > 0 ? a / b : NAN;
}

static void iso_now(char *buf, size_t n)
{
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* argv as one shell-quotable line (single quotes where needed). Owned. */
static char *command_line(int argc, char **argv)
{
    size_t cap = 64, len = 0;
    char *s = shoal_xmalloc(cap);
    s[0] = '\0';
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int plain = *a != '\0';
        for (const char *p = a; *p; p++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                        "-_./=:,+@%", *p))
                plain = 0;
        size_t need = len + 4 * strlen(a) + 8;
        if (need > cap) {
            cap = need * 2;
            s = shoal_xrealloc(s, cap);
        }
        if (i)
            s[len++] = ' ';
        if (plain) {
            len += (size_t)sprintf(s + len, "%s", a);
        } else {
            s[len++] = '\'';
            for (const char *p = a; *p; p++) {
                if (*p == '\'') {
                    memcpy(s + len, "'\\''", 4);
                    len += 4;
                } else {
                    s[len++] = *p;
                }
            }
            s[len++] = '\'';
        }
        s[len] = '\0';
    }
    return s;
}

/* ---- usage and flags ---------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: shoal bench [--model] [DIR] [engine and cluster flags] [options] [--json OUT]\n"
        "\n"
        "Measures one configuration: TTFT, prefill and decode tok/s (median and spread\n"
        "over --reps runs, each in a fresh process), time per token by stage, expert\n"
        "hit rate per tier, bytes read per source, prefetch precision and recall, peak\n"
        "RSS; and, in the same run, the limits they are printed against: fio random\n"
        "O_DIRECT reads of one expert at the engine's queue depth on the model's own\n"
        "experts.bin (a GGUF: of one expert matrix on the file itself), and a\n"
        "STREAM-like RAM probe (docs/BENCHMARKS.md). With an --expert-cache, the\n"
        "disk bound of a decode token: fio's MB/s over the MB it reads at least, the\n"
        "acquires of experts outside the most-used set that fits the cache and pins.\n"
        "\n"
        "  --model DIR, DIR     a shoal container, or a GGUF file (FILE.gguf, its experts\n"
        "                       streamed from it), or a Hugging Face directory (no store\n"
        "                       figures, no fio); default: the bundled model, as 'shoal\n"
        "                       run'\n"
        "  --prompts FILE       one prompt per line: text (models with a tokenizer) or\n"
        "                       'ids: 1,2,3'; '#' lines are skipped (default: random ids)\n"
        "  --prompt-len N       tokens of each random prompt (default 32)\n"
        "  --n-prompts N        random prompts (default 1)\n"
        "  --gen N              tokens generated per prompt, EOS ignored (default 32)\n"
        "  --state cold|warm    cold (default): page cache dropped (root) or the model's\n"
        "                       files evicted (posix_fadvise), expert caches empty;\n"
        "                       warm: after one unmeasured run of the same prompts\n"
        "  --reps N             measured repetitions, one process each (default 3)\n"
        "  --seed S             prompts and sampling seed (default 7)\n"
        "  --limits on|off|FILE measure the limits now (default), skip them, or take\n"
        "                       them from FILE (the JSON of 'shoal bench --limits-only'\n"
        "                       on the same model, as bench/sweep does)\n"
        "  --limits-only        measure the limits and the machine, run no model\n"
        "  --fio-runtime S      seconds of fio (default 5)\n"
        "  --ram-mb N           MiB per RAM probe array (default 512; 3 arrays)\n"
        "  --ram-reps N         RAM probe repetitions, best kept (default 5)\n"
        "  --paired-ram on|off  with limits measured now, the RAM probe again after\n"
        "                       every repetition, each repetition's RAM ratios set\n"
        "                       against the better probe beside it (default on: on a\n"
        "                       shared host the probe alone moves by 2x)\n"
        "  --label TEXT         stored in the JSON (bench/sweep: the configuration)\n"
        "  --json OUT           also write the result here (default: only printed)\n"
        "\n"
        "Engine flags (as 'shoal run'): --threads N, --ctx N, --kv f32|f16|bf16, --isa NAME,\n"
        "--batch N, -v/--verbose\n");
    shoal_session_usage_store(f);
}

/* Returns 0, 1 (printed --help) or 2 (usage error, printed). */
static int parse(struct bench_opts *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->so = shoal_session_opts_default();
    o->prompt_len = 32;
    o->n_prompts = 1;
    o->gen = 32;
    o->reps = 3;
    o->seed = 7;
    o->limits = "on";
    o->fio_runtime = 5;
    o->ram_mib = 512;
    o->ram_reps = 5;
    o->paired_ram = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int r = shoal_session_parse_flag(&o->so, argc, argv, &i);
        if (r < 0)
            return 2;
        if (r > 0)
            continue;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(a, "--limits-only")) {
            o->limits_only = 1;
            continue;
        }
        static const char *valued[] = {"--prompts", "--prompt-len", "--n-prompts", "--gen",
                                       "--state", "--reps", "--seed", "--limits",
                                       "--fio-runtime", "--ram-mb", "--ram-reps", "--label",
                                       "--json", "--paired-ram"};
        int known = 0;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known |= !strcmp(a, valued[k]);
        if (!known) {
            r = shoal_cli_take_path("bench", "model", a, &o->so.model_dir);
            if (r < 0)
                return 2;
            if (r > 0)
                continue;
            if (!strcmp(a, "--max-tokens")) {
                /* run's cap is another concept: a measured run has a fixed length */
                shoal_cli_error("bench: --max-tokens is not a bench option: each prompt "
                                "generates exactly --gen N tokens, EOS ignored");
                return 2;
            }
            shoal_cli_error("bench: unknown option '%s' (see 'shoal bench --help')", a);
            return 2;
        }
        if (i + 1 >= argc) {
            shoal_cli_error("%s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        int bad = 0;
        if (!strcmp(a, "--prompts"))
            o->prompts_file = v;
        else if (!strcmp(a, "--prompt-len"))
            bad = shoal_cli_parse_i64(a, v, 1, 1 << 20, &o->prompt_len);
        else if (!strcmp(a, "--n-prompts"))
            bad = shoal_cli_parse_i64(a, v, 1, 4096, &o->n_prompts);
        else if (!strcmp(a, "--gen"))
            bad = shoal_cli_parse_i64(a, v, 1, 1 << 20, &o->gen);
        else if (!strcmp(a, "--reps"))
            bad = shoal_cli_parse_i64(a, v, 1, 1000, &o->reps);
        else if (!strcmp(a, "--seed"))
            bad = shoal_cli_parse_i64(a, v, 0, INT64_MAX, &o->seed);
        else if (!strcmp(a, "--fio-runtime"))
            bad = shoal_cli_parse_f64(a, v, 1, 3600, &o->fio_runtime);
        else if (!strcmp(a, "--ram-mb"))
            bad = shoal_cli_parse_i64(a, v, 0, 1 << 20, &o->ram_mib);
        else if (!strcmp(a, "--ram-reps"))
            bad = shoal_cli_parse_i64(a, v, 1, 1000, &o->ram_reps);
        else if (!strcmp(a, "--paired-ram")) {
            if (strcmp(v, "on") && strcmp(v, "off")) {
                shoal_cli_error("--paired-ram expects on or off, got '%s'", v);
                return 2;
            }
            o->paired_ram = !strcmp(v, "on");
        } else if (!strcmp(a, "--label"))
            o->label = v;
        else if (!strcmp(a, "--json"))
            o->json_out = v;
        else if (!strcmp(a, "--limits"))
            o->limits = v;
        else if (!strcmp(v, "cold") || !strcmp(v, "warm"))
            o->state = !strcmp(v, "warm") ? BENCH_WARM : BENCH_COLD;
        else {
            shoal_cli_error("--state expects cold or warm, got '%s'", v);
            return 2;
        }
        if (bad)
            return 2;
    }
    if (shoal_session_check_opts(&o->so))
        return 2;
    int st = 0;   /* --workers auto: resolved once, before the probes dial them */
    return shoal_cli_workers_auto(&o->so, &st) < 0 ? st : 0;
}

/* ---- the model, without loading it -------------------------------------------------- */

static const char *dtype_name(enum shoal_dtype t)
{
    switch (t) {
    case SHOAL_DTYPE_F32: return "f32";
    case SHOAL_DTYPE_F16: return "f16";
    case SHOAL_DTYPE_BF16: return "bf16";
    case SHOAL_DTYPE_INT8: return "int8";
    case SHOAL_DTYPE_INT4: return "int4";
    case SHOAL_DTYPE_INT4A8: return "int4a8";
    default: return "?";
    }
}

static void model_free(struct bench_model *bm)
{
    free(bm->experts_path);
    for (int i = 0; i < bm->n_files; i++)
        free(bm->files[i]);
    free(bm->files);
    free(bm->dir);
}

/* The keys a container and a GGUF share: fingerprint, shape, experts' dtype. */
static void model_shape_json(const struct bench_model *bm, json_t *m)
{
    char fp[32];
    snprintf(fp, sizeof fp, "%016" PRIx64, bm->fingerprint);
    jset(m, "fingerprint", json_string(fp));
    jset(m, "model_type", json_string(bm->cfg.family->model_type));
    jset(m, "n_layer", json_integer(bm->cfg.n_layer));
    jset(m, "n_moe_layer", json_integer(bm->n_moe_layer));
    jset(m, "n_expert", json_integer(bm->cfg.n_expert));
    jset(m, "n_expert_used", json_integer(bm->cfg.n_expert_used));
    jset(m, "n_embd", json_integer(bm->cfg.n_embd));
    jset(m, "n_vocab", json_integer(bm->cfg.n_vocab));
    jset(m, "experts_dtype", json_string(bm->dtype));
}

/* {"Q4_K": {"tensors": n, "bytes": b}, ...} of the tensors of a GGUF set,
 * all of them or (experts) only the routed experts' stacked tensors;
 * *bytes gets their total. */
static json_t *gguf_types(const struct shoal_gguf_files *f, int experts, uint64_t *bytes)
{
    json_t *t = json_object();
    *bytes = 0;
    for (uint32_t i = 0; i < shoal_gguf_files_count(f); i++) {
        const struct shoal_gguf *g = shoal_gguf_files_get(f, i);
        for (uint64_t k = 0; k < shoal_gguf_n_tensors(g); k++) {
            struct shoal_gguf_tensor d;
            if (shoal_gguf_tensor(g, k, &d) || (experts && !strstr(d.name, "_exps.")))
                continue;
            const char *name = shoal_ggml_type_name(d.type);
            json_t *e = json_object_get(t, name);
            if (!e) {
                e = json_pack("{s:I, s:I}", "tensors", (json_int_t)0, "bytes", (json_int_t)0);
                json_object_set_new(t, name, e);
            }
            jset(e, "tensors", json_integer(json_integer_value(json_object_get(e, "tensors")) + 1));
            jset(e, "bytes", json_integer(json_integer_value(json_object_get(e, "bytes")) +
                                          (json_int_t)d.nbytes));
            *bytes += d.nbytes;
        }
    }
    return t;
}

/* model_describe for a GGUF file (or any file of a split set): its
 * types, the expert layout the store reads (shoal_container_from_gguf:
 * fingerprint, bytes per expert per layer, the reads), and the region
 * of the file fio reads. The parent loads it once (no OpenMP: the load
 * maps the files and checks the trunk's scales) and closes it. */
static int describe_gguf(const char *path, struct bench_model *bm, json_t *m)
{
    struct shoal_err err = {0};
    struct shoal_model *model = shoal_model_load(path, &err);
    struct shoal_container *ct = model ? shoal_container_from_gguf(model, &err) : NULL;
    struct shoal_gguf_files *f = ct ? shoal_gguf_files_open(path, &err) : NULL;
    if (!f) {
        shoal_cli_error("bench: %s", err.msg);
        shoal_container_close(ct);
        shoal_model_free(model);
        /* a file shoal cannot run is bad input, as for shoal run (exit 2) */
        return shoal_err_is_bad_input(err.code) ? -2 : -1;
    }
    bm->gguf = 1;
    bm->cfg = model->cfg;
    bm->fingerprint = ct->fingerprint;
    const struct shoal_container_gguf *g = ct->gguf;
    bm->n_files = (int)g->n_file;
    bm->files = shoal_xcalloc(g->n_file, sizeof *bm->files);
    for (uint32_t i = 0; i < g->n_file; i++)
        bm->files[i] = shoal_xstrdup(g->files[i]);
    /* per MoE layer: one expert's bytes (the stride of its stacked
     * tensors) and its buffer; per expert: the bytes its page-rounded
     * reads bring in; per file: the expert bytes and their region */
    uint64_t *file_bytes = shoal_xcalloc(g->n_file, sizeof *file_bytes);
    uint64_t *lo = shoal_xcalloc(g->n_file, sizeof *lo), *hi = shoal_xcalloc(g->n_file, sizeof *hi);
    for (uint32_t i = 0; i < g->n_file; i++)
        lo[i] = UINT64_MAX;
    double sum_layer = 0, sum_read = 0, n_read = 0, sum_comp_read = 0, n_comp_read = 0;
    uint64_t max_layer = 0, max_read = 0, max_buf = 0;
    for (int64_t il = 0; il < ct->n_layer; il++) {
        if (ct->layer_offset[il] == UINT64_MAX)
            continue;
        bm->n_moe_layer++;
        uint64_t layer = 0;
        for (int c = 0; c < 6; c++) {
            const struct shoal_expert_range *r = &g->range[il * 6 + c];
            if (!r->bytes)
                continue;
            layer += r->bytes;
            const uint64_t end = r->base + (uint64_t)ct->n_expert * r->bytes;
            file_bytes[r->file] += end - r->base;
            lo[r->file] = r->base < lo[r->file] ? r->base : lo[r->file];
            hi[r->file] = end > hi[r->file] ? end : hi[r->file];
        }
        sum_layer += (double)layer;
        max_layer = layer > max_layer ? layer : max_layer;
        max_buf = g->blob_bytes[il] > max_buf ? g->blob_bytes[il] : max_buf;
        for (int64_t ie = 0; ie < ct->n_expert; ie++) {
            struct shoal_expert_read rd[6];
            const int n = shoal_container_expert_reads(ct, il, ie, rd);
            uint64_t got = 0;
            for (int k = 0; k < n; k++) {
                got += rd[k].len;
                sum_comp_read += (double)rd[k].len;
                n_comp_read++;
            }
            sum_read += (double)got;
            n_read++;
            max_read = got > max_read ? got : max_read;
        }
    }
    uint32_t fb = 0;
    for (uint32_t i = 1; i < g->n_file; i++)
        fb = file_bytes[i] > file_bytes[fb] ? i : fb;
    bm->experts_path = shoal_xstrdup(g->files[fb]);
    bm->first_blob = lo[fb] == UINT64_MAX ? 0 : lo[fb] & ~(uint64_t)(SHOAL_CONTAINER_ALIGN - 1);
    bm->experts_size = hi[fb];
    /* fio's request: one expert matrix as the store reads it (whole 4 KiB
     * pages around it), the mean over every expert of every layer */
    const uint64_t page = SHOAL_CONTAINER_ALIGN;
    bm->blob_bytes = n_comp_read > 0 ? ((uint64_t)(sum_comp_read / n_comp_read) + page / 2) /
                                       page * page : 0;
    if (bm->blob_bytes == 0 && n_comp_read > 0)
        bm->blob_bytes = page;
    bm->compute_bytes = bm->n_moe_layer ? (uint64_t)(sum_layer / (double)bm->n_moe_layer) : 0;
    free(file_bytes);
    free(lo);
    free(hi);
    uint64_t all_bytes = 0, exp_bytes = 0, file_size = 0;
    json_t *types = gguf_types(f, 0, &all_bytes);
    json_t *etypes = gguf_types(f, 1, &exp_bytes);
    json_t *files = json_array();
    for (uint32_t i = 0; i < shoal_gguf_files_count(f); i++) {
        json_array_append_new(files, json_string(shoal_gguf_files_path(f, i)));
        file_size += shoal_gguf_file_size(shoal_gguf_files_get(f, i));
    }
    /* one type for every expert matrix (a static name), or "mixed"
     * (experts_types says which) */
    bm->dtype = "mixed";
    if (json_object_size(etypes) == 1) {
        const char *k;
        json_t *v;
        json_object_foreach(etypes, k, v)
            bm->dtype = shoal_ggml_type_name((uint32_t)shoal_ggml_type_from_name(k));
    }
    const char *arch = NULL;
    shoal_gguf_get_str(shoal_gguf_files_get(f, 0), "general.architecture", &arch, NULL, NULL);
    jset(m, "format", json_string("gguf"));
    jset(m, "files", files);
    jset(m, "architecture", arch ? json_string(arch) : NULL);
    model_shape_json(bm, m);
    jset(m, "types", types);
    jset(m, "experts_types", etypes);
    /* a GGUF expert has no one blob: its matrices are read in place,
     * and its size may differ from layer to layer (a mix of types) */
    jset(m, "blob_bytes", NULL);
    jset(m, "expert_bytes_mean", json_real(sum_layer / (double)(bm->n_moe_layer ? bm->n_moe_layer
                                                                                 : 1)));
    jset(m, "expert_bytes_max", json_integer((json_int_t)max_layer));
    jset(m, "expert_read_bytes_mean", json_real(n_read > 0 ? sum_read / n_read : 0));
    jset(m, "expert_read_bytes_max", json_integer((json_int_t)max_read));
    jset(m, "expert_buffer_bytes_max", json_integer((json_int_t)max_buf));
    jset(m, "experts_bytes", json_integer((json_int_t)exp_bytes));
    jset(m, "experts_file_bytes", json_integer((json_int_t)file_size));
    jset(m, "dense_bytes", json_integer((json_int_t)(all_bytes - exp_bytes)));
    shoal_gguf_files_close(f);
    shoal_container_close(ct);
    shoal_model_free(model);
    return 0;
}

static int model_describe(const char *dir, struct bench_model *bm, json_t **out)
{
    memset(bm, 0, sizeof *bm);
    bm->dir = shoal_xstrdup(dir);
    struct shoal_err err = {0};
    char *man = shoal_path_join(dir, "shoal.json");
    int is_ct = shoal_exists(man);
    free(man);
    json_t *m = json_object();
    jset(m, "dir", json_string(dir));
    if (shoal_model_is_gguf(dir)) {
        const int rc = describe_gguf(dir, bm, m);
        if (rc) {
            json_decref(m);
            model_free(bm);
            return rc;
        }
        *out = m;
        return 0;
    }
    if (!is_ct) {
        /* a broken config.json fails here, before the limits' probes */
        char *config = shoal_path_join(dir, "config.json");
        struct shoal_model_config cfg;
        const int bad = shoal_model_config_load(config, &cfg, &err);
        free(config);
        if (bad) {
            shoal_cli_error("bench: %s", err.msg);
            json_decref(m);
            model_free(bm);
            return -1;
        }
        jset(m, "format", json_string("huggingface"));
        jset(m, "fingerprint", NULL);
        *out = m;
        return 0;
    }
    struct shoal_container *ct = shoal_container_open(dir, &bm->cfg, &err);
    if (!ct) {
        shoal_cli_error("bench: %s", err.msg);
        json_decref(m);
        model_free(bm);
        return -1;
    }
    bm->container = 1;
    bm->fingerprint = ct->fingerprint;
    bm->experts_path = shoal_xstrdup(ct->experts_path);
    bm->experts_size = ct->experts_size;
    bm->blob_bytes = ct->blob_bytes;
    bm->compute_bytes = ct->blob_bytes;
    bm->first_blob = UINT64_MAX;
    for (int64_t il = 0; il < ct->n_layer; il++) {
        if (!shoal_layer_is_moe(&bm->cfg, il))
            continue;
        bm->n_moe_layer++;
        if (ct->layer_offset[il] < bm->first_blob)
            bm->first_blob = ct->layer_offset[il];
    }
    if (bm->first_blob == UINT64_MAX)
        bm->first_blob = 0;
    bm->dtype = dtype_name(ct->experts_dtype);
    jset(m, "format", json_string(ct->shard.count ? "shoal container (shard)" : "shoal container"));
    model_shape_json(bm, m);
    jset(m, "blob_bytes", json_integer((json_int_t)bm->blob_bytes));
    jset(m, "experts_bytes", json_integer((json_int_t)(bm->n_moe_layer * bm->cfg.n_expert *
                                                       (int64_t)bm->blob_bytes)));
    jset(m, "experts_file_bytes", json_integer((json_int_t)bm->experts_size));
    jset(m, "dense_bytes", json_integer((json_int_t)ct->dense_size));
    char *sj = shoal_path_join(dir, "synth.json");
    json_t *syn = json_load_file(sj, 0, NULL);
    free(sj);
    if (syn) {
        json_t *keep = json_object();
        static const char *keys[] = {"command", "seed", "trace", "domain", "drift"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            json_t *v = json_object_get(syn, keys[k]);
            if (v)
                json_object_set(keep, keys[k], v);
        }
        jset(m, "synth", keep);
        json_decref(syn);
    }
    shoal_container_close(ct);
    *out = m;
    return 0;
}

/* ---- limits --------------------------------------------------------------------------- */

static struct shoal_bench_net_params net_params(const struct bench_model *bm, char fp[32])
{
    snprintf(fp, 32, "%016" PRIx64, bm->fingerprint);
    return (struct shoal_bench_net_params){.fingerprint = fp, .cfg = &bm->cfg,
                                           .rtt_rounds = 50, .payload_bytes = 4u << 20,
                                           .bulk_seconds = 1.0};
}

/* The links to the run's --workers (bench_cluster.h). */
static json_t *measure_net(const struct bench_opts *o, const struct bench_model *bm)
{
    if (!bm->container)
        return json_pack("{s:s}", "skipped", "not a container");
    char fp[32];
    struct shoal_bench_net_params np = net_params(bm, fp);
    return shoal_bench_net(&o->so, &np);
}

/* The workers' own store counters over one repetition (two status
 * snapshots taken around it, each a JSON array or NULL): per worker in
 * run["workers"], and as figures worker_hit_rate (demand acquires served
 * from RAM), worker_read_mb, worker_read_mb_s (while reading) and
 * hit_rate_all (the local store's acquires and the workers' together). */
static void add_worker_figures(json_t *run, const json_t *before, const json_t *after)
{
    json_t *f = json_object_get(run, "figures");
    if (!before || !after || !json_is_object(f))
        return;
    json_t *ws = json_array();
    double hits = 0, misses = 0, bytes = 0, busy = 0;
    int complete = 1;
    size_t i;
    json_t *b;
    json_array_foreach(after, i, b) {
        const json_t *a = json_array_get(before, i);
        json_t *d = json_pack("{s:s}", "address", json_string_value(json_object_get(b, "address")) ?
                              json_string_value(json_object_get(b, "address")) : "?");
        if (json_object_get(a, "error") || json_object_get(b, "error")) {
            complete = 0;
            jset(d, "error", json_string(json_string_value(json_object_get(
                json_object_get(b, "error") ? b : a, "error"))));
        } else {
            static const char *keys[] = {"hits", "misses", "bytes_read", "read_busy_seconds",
                                         "requests", "errors"};
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
                jset(d, keys[k], json_real(jget(b, keys[k]) - jget(a, keys[k])));
            hits += jget(d, "hits");
            misses += jget(d, "misses");
            bytes += jget(d, "bytes_read");
            busy += jget(d, "read_busy_seconds");
        }
        json_array_append_new(ws, d);
    }
    jset(run, "workers", ws);
    if (!complete)
        return;
    jset(f, "worker_hit_rate", hits + misses > 0 ? json_real(hits / (hits + misses)) : NULL);
    jset(f, "worker_read_mb", json_real(bytes / 1e6));
    jset(f, "worker_read_mb_s", busy > 0 ? json_real(bytes / 1e6 / busy) : NULL);
    const json_t *st = json_object_get(run, "store");
    double lh = jget(st, "pinned_hits") + jget(st, "cache_hits") + jget(st, "inflight_hits");
    double lu = lh + jget(st, "disk_reads");
    if (!isfinite(lu))
        lh = lu = 0;
    jset(f, "hit_rate_all", lu + hits + misses > 0 ? json_real((lh + hits) / (lu + hits + misses))
                                                   : NULL);
}

/* The RAM probe's parameters of this run (at its threads) */
static struct shoal_bench_ram_params ram_params(const struct bench_opts *o)
{
    struct shoal_bench_ram_params rp = {.threads = (int)o->so.threads,
                                        .array_mib = o->ram_mib, .reps = (int)o->ram_reps};
    return rp;
}

static json_t *measure_limits(const struct bench_opts *o, const struct bench_model *bm)
{
    json_t *lim = json_object();
    char when[32];
    iso_now(when, sizeof when);
    jset(lim, "measured", json_string(when));
    if (bm->container || bm->gguf) {
        struct shoal_bench_fio_params fp = {.path = bm->experts_path,
                                            .offset = bm->first_blob,
                                            .size = bm->experts_size - bm->first_blob,
                                            .bs = bm->blob_bytes,
                                            .iodepth = o->so.queue_depth,
                                            .runtime_s = o->fio_runtime};
        fprintf(stderr, "shoal: bench: fio random O_DIRECT reads of %llu bytes at QD %d on "
                "%s, %.0f s...\n", (unsigned long long)bm->blob_bytes, o->so.queue_depth,
                bm->experts_path, o->fio_runtime);
        json_t *ssd = shoal_bench_fio(&fp);
        if (bm->gguf)
            jset(ssd, "request", json_string(
                "one expert matrix as the store reads it from the GGUF file (whole 4 KiB pages "
                "around it; the mean over every expert), anywhere in the file's expert "
                "region"));
        jset(lim, "ssd", ssd);
    } else {
        jset(lim, "ssd", json_pack("{s:s}", "skipped", "not a shoal container (no experts.bin)"));
    }
    struct shoal_bench_ram_params rp = ram_params(o);
    fprintf(stderr, "shoal: bench: RAM probe, 3 x %lld MiB, %s threads...\n", o->ram_mib,
            o->so.threads ? "the run's" : "default");
    jset(lim, "ram", shoal_bench_ram(&rp));
    jset(lim, "net", measure_net(o, bm));
    return lim;
}

/* Limits from the JSON of an earlier `shoal bench` on the same model. */
static json_t *load_limits(const char *path, const json_t *model)
{
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) {
        if (jerr.line < 0)   /* not opened or not read: no line to name */
            shoal_cli_error("bench: --limits %s: %s", path, jerr.text);
        else
            shoal_cli_error("bench: --limits %s: %s (line %d)", path, jerr.text, jerr.line);
        return NULL;
    }
    json_t *lim = json_object_get(j, "limits");
    const char *fp_file = json_string_value(json_object_get(json_object_get(j, "model"),
                                                            "fingerprint"));
    const char *fp_ours = json_string_value(json_object_get(model, "fingerprint"));
    if (!json_is_object(lim)) {
        shoal_cli_error("bench: --limits %s: no \"limits\" object (write it with 'shoal bench "
                        "--limits-only --json FILE')", path);
        json_decref(j);
        return NULL;
    }
    if ((fp_file || fp_ours) && (!fp_file || !fp_ours || strcmp(fp_file, fp_ours))) {
        shoal_cli_error("bench: --limits %s was measured on model %s, this run's is %s",
                        path, fp_file ? fp_file : "(none)", fp_ours ? fp_ours : "(none)");
        json_decref(j);
        return NULL;
    }
    json_t *copy = json_deep_copy(lim);
    jset(copy, "source", json_string(path));
    json_decref(j);
    return copy;
}

/* ---- the RAM-read bound of a warm decode token ------------------------------------------ */

struct token_bytes {
    uint64_t dense;      /* every dense weight a decode token reads */
    int tied;            /* the head is the embedding */
    const struct shoal_weight *embd;
};

static int count_dense(const struct shoal_weight_slot *sl, void *user)
{
    struct token_bytes *tb = user;
    if (sl->kind != SHOAL_SLOT_DENSE || !sl->w || !sl->w->data)
        return 0;
    if (sl->w == tb->embd && !tb->tied) {   /* a token reads one row of it */
        tb->dense += shoal_weight_row_bytes(sl->w);
        return 0;
    }
    tb->dense += shoal_weight_bytes(sl->w);
    return 0;
}

/* Bytes one warm decode token reads from RAM at least, each once: every
 * dense weight (the embedding's one row, unless it is the head too), the
 * routed experts it uses (n_expert_used of compute_bytes per MoE layer: a
 * GGUF's mean over its layers) and the KV cache rows it attends over at
 * context position pos (sliding-window layers: the window). *kv gets the
 * last part, *dense the first. Thread: the session's. */
static double token_read_bytes(struct shoal_session *s, const struct bench_model *bm,
                               double pos, double *kv, double *dense)
{
    struct shoal_model *m = s->model;
    const struct shoal_model_config *c = &m->cfg;
    struct token_bytes tb = {.tied = c->tie_embeddings, .embd = &m->tok_embd};
    shoal_model_walk(m, count_dense, &tb);   /* a split kv_b's pair too (model.h) */
    double experts = 0, rows = 0;
    for (int64_t il = 0; il < c->n_layer; il++) {
        if (shoal_layer_is_moe(c, il))
            experts += (double)c->n_expert_used * (double)bm->compute_bytes;
        const double w = shoal_layer_uses_window(c, il) ? (double)c->sliding_window : pos;
        rows += w < pos ? w : pos;
    }
    *kv = rows * (double)shoal_kv_elems_per_token(c) *
          (double)shoal_dtype_size(shoal_ctx_kv_dtype(s->ctx));
    *dense = (double)tb.dense;
    return (double)tb.dense + experts + *kv;
}

/* ---- the disk bound of a cold decode token ---------------------------------------------- */

struct expert_use {
    uint64_t n;          /* demand acquires */
    uint64_t bytes;      /* one read of the expert (its blob) */
};

static int cmp_use_desc(const void *a, const void *b)
{
    const struct expert_use *x = a, *y = b;
    const double vx = (double)x->n * (double)x->bytes, vy = (double)y->n * (double)y->bytes;
    return vx < vy ? 1 : vx > vy ? -1 : 0;
}

/* Bytes the decode had to read from disk at least, given what the expert
 * RAM holds (cache_bytes + pin_bytes): the demand acquires (use, each a
 * whole blob) of every expert outside the set of the decode's most-used
 * experts that fits that RAM. Under routing drawn independently per token,
 * keeping the most likely experts is the best a cache can do on average
 * (the A0 policy); the run's own counts make the set the best in
 * hindsight, and a cold run's first reads of the set are not counted. So
 * the store reads about this or more (a policy that follows phases of the
 * routing could read less on some trace), and decode tok/s is at most
 * about fio's bandwidth over it. NAN with an unlimited cache (all fits).
 *   use  [n_layer][n_expert] demand acquires of the decode, borrowed
 * Thread: the session's. */
static double must_read_bytes(struct shoal_session *s, const uint64_t *use,
                              unsigned long long cache_bytes, unsigned long long pin_bytes)
{
    const struct shoal_container *ct = s->model->ct ? s->model->ct : s->gguf_experts;
    if (!use || !ct || cache_bytes == ~0ull)
        return NAN;
    const int64_t NE = ct->n_expert, total = ct->n_layer * NE;
    struct expert_use *v = shoal_xcalloc((size_t)total + 1, sizeof *v);
    int64_t n = 0;
    for (int64_t i = 0; i < total; i++) {
        if (!use[i] || !shoal_container_holds(ct, i / NE, i % NE))
            continue;
        v[n++] = (struct expert_use){.n = use[i],
                                     .bytes = shoal_container_blob_bytes(ct, i / NE)};
    }
    qsort(v, (size_t)n, sizeof *v, cmp_use_desc);
    const double room = (double)cache_bytes + (double)pin_bytes;
    double held = 0, must = 0;
    for (int64_t i = 0; i < n; i++) {
        if (held + (double)v[i].bytes <= room)
            held += (double)v[i].bytes;
        else
            must += (double)v[i].n * (double)v[i].bytes;
    }
    free(v);
    return must;
}

/* ---- one repetition (in a child process) ------------------------------------------------ */

struct prompt_set {
    char **lines;        /* [n] text lines from --prompts, or NULL */
    int64_t n;
};

struct rep_job {
    const struct bench_opts *o;
    const struct bench_model *bm;
    const struct prompt_set *ps;
    int rep;
};

/* what one measured phase accumulates */
struct phase_acc {
    double seconds;                   /* wall */
    int64_t tokens;
    struct shoal_ctx_timings t;       /* deltas */
    double stall;                     /* store: waiting for reads */
    double wire_bytes;                /* cluster: sent + received, every executor */
    double rounds;                    /* cluster: layer rounds that waited on workers */
    json_t *wire;                     /* cluster: per-executor deltas, summed (owned) */
    double bal_steps, bal_ratio_sum;  /* cluster: layer steps, sum of max/mean busy */
    double split_experts, split_rows; /* cluster: entries split among holders, their rows */
    double step_reads;                /* cluster: worker disk reads */
    json_t *reads_hist;               /* cluster: layer steps by those reads, deltas (owned) */
};

/* Add the balance counters of b minus those of a (borrowed, NULL: none). */
static void balance_add(struct phase_acc *acc, const json_t *a, const json_t *b)
{
    if (!a || !b)
        return;
    acc->bal_steps += jget(b, "steps") - jget(a, "steps");
    acc->bal_ratio_sum += jget(b, "ratio_sum") - jget(a, "ratio_sum");
    acc->split_experts += jget(b, "split_experts") - jget(a, "split_experts");
    acc->split_rows += jget(b, "split_rows") - jget(a, "split_rows");
    acc->step_reads += jget(b, "step_reads") - jget(a, "step_reads");
    const json_t *ha = json_object_get(a, "reads_hist"), *hb = json_object_get(b, "reads_hist");
    const char *key;
    json_t *v;
    if (!acc->reads_hist)
        acc->reads_hist = json_object();
    json_object_foreach((json_t *)hb, key, v) {
        const json_int_t d = json_integer_value(v) - json_integer_value(json_object_get(ha, key)) +
                             json_integer_value(json_object_get(acc->reads_hist, key));
        if (d > 0)
            json_object_set_new(acc->reads_hist, key, json_integer(d));
    }
}

static void timings_add_delta(struct shoal_ctx_timings *acc, const struct shoal_ctx_timings *a,
                              const struct shoal_ctx_timings *b)
{
    acc->attention += b->attention - a->attention;
    acc->routing += b->routing - a->routing;
    acc->experts += b->experts - a->experts;
    acc->combine += b->combine - a->combine;
    acc->head += b->head - a->head;
    acc->expert_wait += b->expert_wait - a->expert_wait;
    acc->network += b->network - a->network;
}

static void store_stats(struct shoal_session *s, struct shoal_expert_store_stats *st)
{
    memset(st, 0, sizeof *st);
    if (s->model->store)
        shoal_expert_store_stats_get(s->model->store, st);
}

/* Add the per-executor deltas d (borrowed) to *sum (created on first use). */
static void wire_add(json_t **sum, const json_t *d)
{
    if (!d)
        return;
    if (!*sum) {
        *sum = json_deep_copy(d);
        return;
    }
    size_t i;
    json_t *e;
    json_array_foreach(*sum, i, e) {
        const json_t *x = json_array_get(d, i);
        static const char *keys[] = {"bytes_sent", "bytes_received", "wire_bytes",
                                     "payload_sent", "payload_received", "ssd_bytes"};
        for (size_t k = 0; k < 6; k++)
            json_object_set_new(e, keys[k], json_real(jget(e, keys[k]) + jget(x, keys[k])));
        json_object_set_new(e, "busy_s", json_real(jget(e, "busy_s") + jget(x, "busy_s")));
        json_object_set_new(e, "busy_steps", json_integer(
            json_integer_value(json_object_get(e, "busy_steps")) +
            json_integer_value(json_object_get(x, "busy_steps"))));
        static const char *ints[] = {"requests", "errors", "reconnects"};
        for (size_t k = 0; k < 3; k++)
            json_object_set_new(e, ints[k], json_integer(
                json_integer_value(json_object_get(e, ints[k])) +
                json_integer_value(json_object_get(x, ints[k]))));
    }
}

struct rep_acc {
    struct phase_acc prefill, decode;
    uint64_t *dec_use;                /* [n_layer][n_expert] decode's demand acquires, or NULL */
    uint64_t *use_a, *use_b;          /* [n_layer][n_expert][SHOAL_EXPERT_N_TIERS] snapshots */
    double dec_read_bytes;            /* expert bytes read during decode, every purpose */
    double ttft_sum, ttft_min, ttft_max;
    int64_t n_prompt_tokens, n_gen_tokens, n_prompts;
    XXH64_state_t *ids_hash;          /* generated ids of every prompt, in order */
};

/* Prefill prompt, then generate gen tokens (EOS ignored); acc may be NULL
 * (the warm-up pass). Returns 0 or -1 after printing an error. */
static int run_prompt(struct shoal_session *s, const int32_t *ids, int64_t n, int64_t gen,
                      uint64_t seed, struct rep_acc *acc)
{
    struct shoal_err err = {0};
    const int64_t V = s->model->cfg.n_vocab;
    shoal_session_reset(s);
    struct shoal_sampler_params sp = shoal_sampler_params_default();
    sp.seed = seed;
    struct shoal_sampler *smp = shoal_sampler_create(sp, V);
    int32_t *hist = shoal_xmalloc((size_t)(n + gen + 1) * sizeof *hist);
    memcpy(hist, ids, (size_t)n * sizeof *hist);
    int64_t n_hist = n;
    struct shoal_expert_store_stats st0, st1, st2;
    struct shoal_ctx_timings t0 = *shoal_ctx_timings(s->ctx), t1, t2;
    store_stats(s, &st0);
    json_t *c0 = acc ? shoal_bench_cluster_snapshot(s) : NULL, *c1 = NULL, *c2 = NULL;
    const double r0 = shoal_bench_cluster_rounds(s);
    double r1 = r0;
    json_t *b0 = acc ? shoal_bench_cluster_balance(s) : NULL, *b1 = NULL, *b2 = NULL;
    int rc = 0;
    double w0 = shoal_time_s();
    if (shoal_ctx_eval(s->ctx, ids, n, s->logits, 0, &err)) {
        shoal_cli_error("bench: %s", err.msg);
        rc = -1;
        goto out;
    }
    double w1 = shoal_time_s();
    t1 = *shoal_ctx_timings(s->ctx);
    store_stats(s, &st1);
    if (acc && acc->dec_use)
        shoal_expert_store_use_get(s->model->store, acc->use_a);
    c1 = acc ? shoal_bench_cluster_snapshot(s) : NULL;
    r1 = shoal_bench_cluster_rounds(s);
    b1 = acc ? shoal_bench_cluster_balance(s) : NULL;
    int32_t id = shoal_sampler_sample(smp, s->logits, hist, n_hist);
    hist[n_hist++] = id;
    double ttft = shoal_time_s() - w0;
    double w2 = shoal_time_s();
    for (int64_t step = 1; step < gen; step++) {
        if (shoal_ctx_eval(s->ctx, &id, 1, s->logits, 0, &err)) {
            shoal_cli_error("bench: %s", err.msg);
            rc = -1;
            goto out;
        }
        id = shoal_sampler_sample(smp, s->logits, hist, n_hist);
        hist[n_hist++] = id;
    }
    double w3 = shoal_time_s();
    t2 = *shoal_ctx_timings(s->ctx);
    store_stats(s, &st2);
    if (acc && acc->dec_use) {
        shoal_expert_store_use_get(s->model->store, acc->use_b);
        const struct shoal_model_config *c = &s->model->cfg;
        for (int64_t i = 0; i < c->n_layer * c->n_expert; i++)
            for (int t = 0; t < SHOAL_EXPERT_N_TIERS; t++)
                acc->dec_use[i] += acc->use_b[i * SHOAL_EXPERT_N_TIERS + t] -
                                   acc->use_a[i * SHOAL_EXPERT_N_TIERS + t];
        acc->dec_read_bytes += (double)(st2.bytes_read - st1.bytes_read);
    }
    c2 = acc ? shoal_bench_cluster_snapshot(s) : NULL;
    b2 = acc ? shoal_bench_cluster_balance(s) : NULL;
    if (acc) {
        balance_add(&acc->prefill, b0, b1);
        balance_add(&acc->decode, b1, b2);
        double w;
        json_t *d = shoal_bench_cluster_delta(c0, c1, &w);
        wire_add(&acc->prefill.wire, d);
        acc->prefill.wire_bytes += w;
        json_decref(d);
        d = shoal_bench_cluster_delta(c1, c2, &w);
        wire_add(&acc->decode.wire, d);
        acc->decode.wire_bytes += w;
        json_decref(d);
        acc->prefill.rounds += r1 - r0;
        acc->decode.rounds += shoal_bench_cluster_rounds(s) - r1;
        acc->prefill.seconds += w1 - w0;
        acc->prefill.tokens += n;
        timings_add_delta(&acc->prefill.t, &t0, &t1);
        acc->prefill.stall += st1.stall_seconds - st0.stall_seconds;
        acc->decode.seconds += w3 - w2;
        acc->decode.tokens += gen - 1;
        timings_add_delta(&acc->decode.t, &t1, &t2);
        acc->decode.stall += st2.stall_seconds - st1.stall_seconds;
        if (acc->n_prompts == 0 || ttft < acc->ttft_min)
            acc->ttft_min = ttft;
        if (acc->n_prompts == 0 || ttft > acc->ttft_max)
            acc->ttft_max = ttft;
        acc->ttft_sum += ttft;
        acc->n_prompts++;
        acc->n_prompt_tokens += n;
        acc->n_gen_tokens += gen;
        XXH64_update(acc->ids_hash, hist + n, (size_t)gen * sizeof *hist);
    }
out:
    json_decref(c0);
    json_decref(c1);
    json_decref(c2);
    json_decref(b0);
    json_decref(b1);
    json_decref(b2);
    free(hist);
    shoal_sampler_free(smp);
    return rc;
}

/* Tokenize the prompt set (or draw random ones). Returns 0 or -1. */
static int prompts_tokens(struct shoal_session *s, const struct bench_opts *o,
                          const struct prompt_set *ps, int32_t ***ids, int64_t **n, int64_t *count)
{
    const int64_t V = s->model->cfg.n_vocab;
    const int64_t np = ps->lines ? ps->n : o->n_prompts;
    *ids = shoal_xcalloc((size_t)np, sizeof **ids);
    *n = shoal_xcalloc((size_t)np, sizeof **n);
    *count = np;
    for (int64_t p = 0; p < np; p++) {
        if (!ps->lines) {
            (*ids)[p] = shoal_xmalloc((size_t)o->prompt_len * sizeof(int32_t));
            uint64_t z = (uint64_t)o->seed * 0x9e3779b97f4a7c15ull + (uint64_t)p + 1;
            for (int64_t i = 0; i < o->prompt_len; i++) {
                /* splitmix64: the same prompts for every run of a seed */
                z += 0x9e3779b97f4a7c15ull;
                uint64_t x = z;
                x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
                x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
                x ^= x >> 31;
                (*ids)[p][i] = (int32_t)(x % (uint64_t)(V > 1 ? V - 1 : 1));
            }
            (*n)[p] = o->prompt_len;
            continue;
        }
        const char *line = ps->lines[p];
        size_t cnt = 0;
        int rc;
        if (!strncmp(line, "ids:", 4)) {
            rc = shoal_cli_parse_id_list(line + 4, &(*ids)[p], &cnt);
            for (size_t i = 0; rc == 0 && i < cnt; i++)
                if ((*ids)[p][i] >= V) {
                    shoal_cli_error("bench: %s: prompt %lld: token id %d is outside the "
                                    "vocabulary [0, %lld)", o->prompts_file, (long long)p + 1,
                                    (*ids)[p][i], (long long)V);
                    rc = -1;
                }
        } else if (!s->tok) {
            shoal_cli_error("bench: %s: prompt %lld is text, but the model has no tokenizer; "
                            "write it as 'ids: 1,2,3'", o->prompts_file, (long long)p + 1);
            rc = -1;
        } else {
            rc = shoal_cli_tokenize(s, line, NULL, 1, &(*ids)[p], &cnt);
        }
        if (rc)
            return -1;
        (*n)[p] = (int64_t)cnt;
    }
    return 0;
}

static double peak_rss_bytes(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return NAN;
#ifdef __APPLE__
    return (double)ru.ru_maxrss;          /* bytes on macOS */
#else
    return (double)ru.ru_maxrss * 1024.0; /* KiB on Linux */
#endif
}

static void pct_set(json_t *o, const char *k, uint64_t a, uint64_t b)
{
    jset(o, k, b ? json_real((double)a / (double)b) : NULL);
}

static int rep_child(void *user, json_t **out)
{
    const struct rep_job *job = user;
    const struct bench_opts *o = job->o;
    json_t *r = json_object();
    *out = r;
    jset(r, "rep", json_integer(job->rep));
    jset(r, "load_before", shoal_bench_loadavg());
    double t_open0 = shoal_time_s();
    struct shoal_session_opts so = o->so;
    struct shoal_session *s = shoal_cli_session_open(&so, NULL);
    if (!s) {
        jset(r, "error", json_string("the model did not open (see the error above)"));
        return 1;
    }
    jset(r, "open_seconds", json_real(shoal_time_s() - t_open0));
    jset(r, "threads", json_integer(omp_get_max_threads()));
    int32_t **ids = NULL;
    int64_t *n = NULL, np = 0;
    int rc = 0;
    struct rep_acc acc;
    memset(&acc, 0, sizeof acc);
    acc.ids_hash = XXH64_createState();
    XXH64_reset(acc.ids_hash, 0);
    if (s->model->store) {
        const size_t n_ex = (size_t)(s->model->cfg.n_layer * s->model->cfg.n_expert);
        acc.dec_use = shoal_xcalloc(n_ex + 1, sizeof *acc.dec_use);
        acc.use_a = shoal_xcalloc(n_ex * SHOAL_EXPERT_N_TIERS + 1, sizeof *acc.use_a);
        acc.use_b = shoal_xcalloc(n_ex * SHOAL_EXPERT_N_TIERS + 1, sizeof *acc.use_b);
    }
    if (prompts_tokens(s, o, job->ps, &ids, &n, &np)) {
        jset(r, "error", json_string("the prompts could not be read (see the error above)"));
        rc = 1;
        goto done;
    }
    int64_t longest = 0;
    for (int64_t p = 0; p < np; p++)
        longest = n[p] > longest ? n[p] : longest;
    if (longest + o->gen > shoal_ctx_n_ctx(s->ctx)) {
        const int64_t max_pos = s->model->cfg.max_pos;
        if (max_pos > 0 && longest + o->gen > max_pos)
            shoal_cli_error("bench: a prompt of %lld tokens + %lld generated exceeds the "
                            "model's max_position_embeddings (%lld); lower --prompt-len or "
                            "--gen", (long long)longest, o->gen, (long long)max_pos);
        else
            shoal_cli_error("bench: a prompt of %lld tokens + %lld generated exceeds the "
                            "context (%lld); pass --ctx", (long long)longest, o->gen,
                            (long long)shoal_ctx_n_ctx(s->ctx));
        jset(r, "error", json_string("prompt + --gen longer than the context"));
        rc = 1;
        goto done;
    }
    if (o->state == BENCH_WARM) {
        double tw = shoal_time_s();
        for (int64_t p = 0; p < np && !rc; p++)
            rc = run_prompt(s, ids[p], n[p], o->gen, (uint64_t)o->seed + (uint64_t)p, NULL);
        jset(r, "warmup_seconds", json_real(shoal_time_s() - tw));
    }
    struct shoal_expert_store_stats sa, sb;
    store_stats(s, &sa);
    for (int64_t p = 0; p < np && !rc; p++)
        rc = run_prompt(s, ids[p], n[p], o->gen, (uint64_t)o->seed + (uint64_t)p, &acc);
    store_stats(s, &sb);
    if (rc) {
        jset(r, "error", json_string("generation failed (see the error above)"));
        goto done;
    }
    {
        const struct bench_model *bm = job->bm;
        const struct shoal_model_config *c = &s->model->cfg;
        int64_t n_moe = 0;
        for (int64_t il = 0; il < c->n_layer; il++)
            n_moe += shoal_layer_is_moe(c, il);
        jset(r, "prompts", json_integer(acc.n_prompts));
        jset(r, "prompt_tokens", json_integer(acc.n_prompt_tokens));
        jset(r, "generated_tokens", json_integer(acc.n_gen_tokens));
        char hx[32];
        snprintf(hx, sizeof hx, "%016" PRIx64, (uint64_t)XXH64_digest(acc.ids_hash));
        jset(r, "generated_ids_xxh64", json_string(hx));

        /* flat figures: the parent takes median / min / max of each */
        json_t *f = json_object();
        const double dec_s = acc.decode.seconds, dec_n = (double)acc.decode.tokens;
        jset(f, "ttft_ms", json_real(1e3 * acc.ttft_sum / (double)acc.n_prompts));
        jset(f, "prefill_tok_s", jnum((double)acc.prefill.tokens / acc.prefill.seconds));
        jset(f, "decode_tok_s", jnum(dec_n / dec_s));
        const struct shoal_ctx_timings *dt = &acc.decode.t;
        const double per = dec_n > 0 ? 1e3 / dec_n : NAN;
        const double staged = dt->attention + dt->routing + dt->experts + dt->combine + dt->head;
        jset(f, "ms_per_token", jnum(dec_s * per));
        jset(f, "ms_attention", jnum(dt->attention * per));
        jset(f, "ms_routing", jnum(dt->routing * per));
        const double net = shoal_bench_network_seconds(dt);
        const double compute = dt->experts - acc.decode.stall - net;
        jset(f, "ms_expert_wait", jnum(acc.decode.stall * per));
        jset(f, "ms_expert_compute", jnum(compute * per));
        jset(f, "ms_network", s->cluster ? jnum(net * per) : NULL);
        jset(f, "ms_combine", jnum(dt->combine * per));
        jset(f, "ms_head", jnum(dt->head * per));
        jset(f, "ms_other", jnum((dec_s - staged) * per));
        const double ebytes = dec_n * (double)n_moe * (double)c->n_expert_used *
                              (double)bm->compute_bytes;
        jset(f, "expert_compute_mb_s", bm->compute_bytes ?
             jnum(ebytes / 1e6 / compute) : NULL);
        {   /* the warm bound: at the decode's mean context position */
            const double mean_pos = (double)acc.n_prompt_tokens / (double)acc.n_prompts +
                                    (double)o->gen / 2.0;
            double kv = 0, dense = 0;
            const double tb = token_read_bytes(s, bm, mean_pos, &kv, &dense);
            jset(f, "token_read_mb", jnum(tb / 1e6));
            jset(f, "token_kv_read_mb", jnum(kv / 1e6));
            /* the parts a step of several rows reads once (dense) or per
             * expert of its union (bench/serve_bench.py's bound) */
            jset(f, "token_dense_read_mb", jnum(dense / 1e6));
            jset(f, "expert_compute_mb", jnum((double)bm->compute_bytes / 1e6));
        }
        jset(f, "peak_rss_mb", jnum(peak_rss_bytes() / 1e6));
        if (s->model->store) {
            const uint64_t used = (sb.pinned_hits - sa.pinned_hits) +
                                  (sb.cache_hits - sa.cache_hits) +
                                  (sb.inflight_hits - sa.inflight_hits) +
                                  (sb.disk_reads - sa.disk_reads);
            pct_set(f, "hit_pinned", sb.pinned_hits - sa.pinned_hits, used);
            pct_set(f, "hit_cache", sb.cache_hits - sa.cache_hits, used);
            pct_set(f, "hit_inflight", sb.inflight_hits - sa.inflight_hits, used);
            pct_set(f, "miss_disk", sb.disk_reads - sa.disk_reads, used);
            pct_set(f, "hit_rate", used - (sb.disk_reads - sa.disk_reads), used);
            const double rbytes = (double)(sb.bytes_read - sa.bytes_read);
            const double busy = sb.read_busy_seconds - sa.read_busy_seconds;
            jset(f, "expert_read_mb", json_real(rbytes / 1e6));
            jset(f, "decode_read_mb_per_token", jnum(acc.dec_read_bytes / 1e6 / dec_n));
            const double least = must_read_bytes(s, acc.dec_use, o->so.expert_cache, o->so.pin);
            jset(f, "decode_least_read_mb_per_token", jnum(least / 1e6 / dec_n));
            jset(f, "expert_read_mb_s", jnum(busy > 0 ? rbytes / 1e6 / busy : NAN));
            jset(f, "expert_read_busy_s", json_real(busy));
            const uint64_t pr = sb.prefetch_reads - sa.prefetch_reads;
            pct_set(f, "prefetch_precision", sb.prefetch_used - sa.prefetch_used, pr);
            pct_set(f, "prefetch_recall", sb.used_hinted - sa.used_hinted,
                    sb.used_after_hint - sa.used_after_hint);
            json_t *src = json_array();
            for (int i = 0; i < sb.n_source; i++)
                json_array_append_new(src, json_pack(
                    "{s:s, s:f, s:b, s:I, s:f, s:I}", "path", sb.source[i].path,
                    "weight", sb.source[i].weight, "direct", sb.source[i].direct,
                    "reads", (json_int_t)(sb.source[i].reads - sa.source[i].reads),
                    "bytes_read", (double)(sb.source[i].bytes_read - sa.source[i].bytes_read),
                    "errors", (json_int_t)(sb.source[i].errors - sa.source[i].errors)));
            jset(r, "sources", src);
            jset(r, "store", json_pack(
                "{s:s, s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}",
                "io_engine", sb.io_engine ? sb.io_engine : "?", "queue_depth", sb.queue_depth,
                "pinned_hits", (json_int_t)(sb.pinned_hits - sa.pinned_hits),
                "cache_hits", (json_int_t)(sb.cache_hits - sa.cache_hits),
                "inflight_hits", (json_int_t)(sb.inflight_hits - sa.inflight_hits),
                "disk_reads", (json_int_t)(sb.disk_reads - sa.disk_reads),
                "prefetch_reads", (json_int_t)pr,
                "prefetch_used", (json_int_t)(sb.prefetch_used - sa.prefetch_used),
                "evictions", (json_int_t)(sb.evictions - sa.evictions),
                "cached_bytes", (json_int_t)sb.cached_bytes,
                "peak_expert_bytes", (json_int_t)sb.peak_expert_bytes,
                "stall_seconds", sb.stall_seconds - sa.stall_seconds));
        }
        if (s->cluster) {
            jset(f, "wire_mb", json_real((acc.prefill.wire_bytes + acc.decode.wire_bytes) / 1e6));
            jset(f, "wire_mb_s", jnum(acc.decode.wire_bytes / 1e6 / dec_s));
            /* per remote executor, for its link's ratio (bench_ratios) */
            size_t i;
            json_t *e;
            json_array_foreach(acc.decode.wire, i, e) {
                char key[200];
                snprintf(key, sizeof key, "wire_mb_s@%s",
                         json_string_value(json_object_get(e, "address")));
                jset(f, key, jnum(jget(e, "wire_bytes") / 1e6 / dec_s));
            }
            /* issue 33: the slowest executor's busy time per layer step over
             * the mean, averaged over steps, and the rows split among holders */
            jset(f, "busy_max_mean_prefill",
                 jnum(acc.prefill.bal_steps > 0 ? acc.prefill.bal_ratio_sum /
                                                      acc.prefill.bal_steps : NAN));
            jset(f, "busy_max_mean_decode",
                 jnum(acc.decode.bal_steps > 0 ? acc.decode.bal_ratio_sum /
                                                     acc.decode.bal_steps : NAN));
            /* per token: the workers' disk reads, and the reads of the busiest
             * disk had each layer step's been spread evenly (a step's floor) */
            jset(f, "worker_reads_prefill", jnum(acc.prefill.step_reads / acc.prefill.tokens));
            jset(f, "worker_reads_decode", jnum(acc.decode.step_reads / acc.decode.tokens));
            jset(f, "step_reads_prefill",
                 acc.prefill.reads_hist ? json_incref(acc.prefill.reads_hist) : json_object());
            jset(f, "step_reads_decode",
                 acc.decode.reads_hist ? json_incref(acc.decode.reads_hist) : json_object());
            jset(f, "split_experts_prefill", json_real(acc.prefill.split_experts));
            jset(f, "split_rows_prefill", json_real(acc.prefill.split_rows));
            json_t *ex = json_deep_copy(acc.decode.wire);
            jset(r, "executors_decode", ex);
            jset(r, "executors_prefill", json_deep_copy(acc.prefill.wire));
            /* the wire against the f32 rows the placement needed, per token */
            const struct phase_acc *ph[2] = {&acc.prefill, &acc.decode};
            static const char *name[2] = {"prefill", "decode"};
            for (int k = 0; k < 2; k++) {
                double sent = 0, recv = 0, need_s = 0, need_r = 0, ssd = 0;
                json_array_foreach(ph[k]->wire, i, e) {
                    sent += jget(e, "bytes_sent");
                    recv += jget(e, "bytes_received");
                    need_s += jget(e, "payload_sent");
                    need_r += jget(e, "payload_received");
                    ssd += jget(e, "ssd_bytes");
                }
                const double tok = ph[k]->tokens > 0 ? (double)ph[k]->tokens : 1.0;
                char key[64];
#define PHASE_FIG(suffix, v)                                                        \
    do {                                                                            \
        snprintf(key, sizeof key, "%s_%s", name[k], suffix);                        \
        jset(f, key, v);                                                            \
    } while (0)
                PHASE_FIG("wire_sent_kb_per_token", json_real(sent / 1e3 / tok));
                PHASE_FIG("wire_received_kb_per_token", json_real(recv / 1e3 / tok));
                PHASE_FIG("wire_over_minimum",
                          need_s + need_r > 0 ? json_real((sent + recv) / (need_s + need_r))
                                              : json_null());
                PHASE_FIG("round_trips_per_token", json_real(ph[k]->rounds / tok));
                PHASE_FIG("worker_ssd_mb_per_token", json_real(ssd / 1e6 / tok));
#undef PHASE_FIG
            }
        }
        jset(r, "figures", f);
        jset(r, "phases", json_pack(
            "{s:{s:f, s:I, s:f, s:f, s:f, s:f, s:f, s:f}, s:{s:f, s:I, s:f, s:f, s:f, s:f, "
            "s:f, s:f}}",
            "prefill", "seconds", acc.prefill.seconds, "tokens", (json_int_t)acc.prefill.tokens,
            "attention", acc.prefill.t.attention, "routing", acc.prefill.t.routing,
            "experts", acc.prefill.t.experts, "store_stall", acc.prefill.stall,
            "combine", acc.prefill.t.combine, "head", acc.prefill.t.head,
            "decode", "seconds", acc.decode.seconds, "tokens", (json_int_t)acc.decode.tokens,
            "attention", dt->attention, "routing", dt->routing, "experts", dt->experts,
            "store_stall", acc.decode.stall, "combine", dt->combine, "head", dt->head));
        jset(json_object_get(json_object_get(r, "phases"), "prefill"), "network",
             json_real(shoal_bench_network_seconds(&acc.prefill.t)));
        jset(json_object_get(json_object_get(r, "phases"), "decode"), "network",
             json_real(shoal_bench_network_seconds(dt)));
        /* of experts: the routed batch-unions on the executor (the rest is
         * the coordinator's own dense MLP and shared expert) */
        jset(json_object_get(json_object_get(r, "phases"), "prefill"), "expert_wait",
             json_real(acc.prefill.t.expert_wait));
        jset(json_object_get(json_object_get(r, "phases"), "decode"), "expert_wait",
             json_real(dt->expert_wait));
        jset(r, "ttft_ms_min", json_real(1e3 * acc.ttft_min));
        jset(r, "ttft_ms_max", json_real(1e3 * acc.ttft_max));
    }
done:
    jset(r, "load_after", shoal_bench_loadavg());
    if (ids)
        for (int64_t p = 0; p < np; p++)
            free(ids[p]);
    free(ids);
    free(n);
    XXH64_freeState(acc.ids_hash);
    free(acc.dec_use);
    free(acc.use_a);
    free(acc.use_b);
    json_decref(acc.prefill.wire);
    json_decref(acc.decode.wire);
    json_decref(acc.prefill.reads_hist);
    json_decref(acc.decode.reads_hist);
    shoal_cli_session_close(s);
    return rc;
}

/* ---- aggregation ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* v[0 .. n) sorted in place (n >= 1); returns their median */
static double median_of(double *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* summary[name] = {median, min, max, spread (max-min)/median, n} over the
 * repetitions' figures that are numbers */
static json_t *summarize(json_t *runs)
{
    json_t *sum = json_object();
    json_t *first = NULL;
    size_t i;
    json_t *run;
    json_array_foreach(runs, i, run) {
        if (json_is_object(json_object_get(run, "figures"))) {
            first = json_object_get(run, "figures");
            break;
        }
    }
    if (!first)
        return sum;
    const char *key;
    json_t *unused;
    double *v = shoal_xmalloc((json_array_size(runs) + 1) * sizeof *v);
    json_object_foreach(first, key, unused) {
        size_t n = 0;
        json_array_foreach(runs, i, run) {
            double x = jget(json_object_get(run, "figures"), key);
            if (isfinite(x))
                v[n++] = x;
        }
        if (!n) {
            jset(sum, key, NULL);
            continue;
        }
        const double med = median_of(v, n);
        json_t *o = json_object();
        jset(o, "median", json_real(med));
        jset(o, "min", json_real(v[0]));
        jset(o, "max", json_real(v[n - 1]));
        jset(o, "spread", jnum(med != 0 ? (v[n - 1] - v[0]) / fabs(med) : NAN));
        jset(o, "n", json_integer((json_int_t)n));
        jset(sum, key, o);
    }
    free(v);
    return sum;
}

static double med_of(const json_t *summary, const char *k)
{
    return jget(json_object_get(summary, k), "median");
}

/* ratios of the medians to the limits of this run */
/* One ratio entry {figure, limit, ratio, what} (figure / limit, null when
 * either is unknown), added to r under key; returns it for extra fields. */
static json_t *add_ratio(json_t *r, const char *key, double figure, double limit,
                         const char *what)
{
    json_t *x = json_object();
    jset(x, "figure", jnum(figure));
    jset(x, "limit", jnum(limit));
    jset(x, "ratio", jnum(ratio(figure, limit)));
    jset(x, "what", json_string(what));
    jset(r, key, x);
    return x;
}

/* With a RAM probe after every repetition (--paired-ram): x's figure and
 * limit become each repetition's against the better read probe beside it
 * (the one before it: the limits' for the first, the last repetition's
 * after it for the others), per token over its token_read_mb when
 * per_token; x's ratio the median of those ratios, with their range and
 * the probes'. On a shared host the probe alone moves by 2x between
 * minutes while the engine's figure holds: a ratio against a probe taken
 * minutes away measures the neighbours. Leaves x as it was when a
 * repetition lacks its probe. */
static void pair_ratio(json_t *x, const json_t *runs, const json_t *limits, const char *key,
                       int per_token)
{
    const size_t nr = json_array_size(runs);
    if (!nr)
        return;
    double *rat = shoal_xmalloc(3 * nr * sizeof *rat), *fig = rat + nr, *lim = rat + 2 * nr;
    double pmin = INFINITY, pmax = 0;
    size_t n = 0;
    double before = jget(json_object_get(limits, "ram"), "read_gbs");
    for (size_t k = 0; k < nr; k++) {
        const json_t *run = json_array_get(runs, k), *f = json_object_get(run, "figures");
        const double after = jget(json_object_get(run, "ram_after"), "read_gbs");
        if (!isfinite(after)) {
            free(rat);
            return;
        }
        pmin = fmin(pmin, fmin(after, isfinite(before) ? before : after));
        pmax = fmax(pmax, fmax(after, isfinite(before) ? before : after));
        const double probe = (isfinite(before) && before > after ? before : after) * 1e3;
        before = after;
        const double fk = jget(f, key), tok = per_token ? jget(f, "token_read_mb") : 1.0;
        if (!isfinite(fk) || !(tok > 0))
            continue;
        fig[n] = fk;
        lim[n] = probe / tok;
        rat[n] = fk / lim[n];
        n++;
    }
    if (n) {
        json_t *per = json_array();   /* in repetition order, before median_of sorts */
        for (size_t k = 0; k < n; k++)
            json_array_append_new(per, jnum(rat[k]));
        jset(x, "ratio_per_rep", per);
        jset(x, "figure", jnum(median_of(fig, n)));
        jset(x, "limit", jnum(median_of(lim, n)));
        jset(x, "ratio", jnum(median_of(rat, n)));
        jset(x, "ratio_min", jnum(rat[0]));
        jset(x, "ratio_max", jnum(rat[n - 1]));
        jset(x, "probe_read_gbs_min", jnum(pmin));
        jset(x, "probe_read_gbs_max", jnum(pmax));
        jset(x, "paired", json_string("each repetition against the better RAM read probe "
                                      "beside it; ratio: their median; figure, limit: "
                                      "medians"));
    }
    free(rat);
}

static json_t *ratios(const json_t *summary, const json_t *limits, const json_t *runs)
{
    json_t *r = json_object();
    const json_t *ssd = json_object_get(limits, "ssd"), *ram = json_object_get(limits, "ram");
    double fio = jget(ssd, "mb_per_s"), ram_read = jget(ram, "read_gbs") * 1e3;
    double ram_triad = jget(ram, "triad_gbs") * 1e3;
    double rd = med_of(summary, "expert_read_mb_s"), cmp = med_of(summary, "expert_compute_mb_s");
    add_ratio(r, "expert_read_vs_ssd", rd, fio,
              "expert read MB/s while reading / fio random O_DIRECT reads of one expert at "
              "the engine's queue depth");
    pair_ratio(add_ratio(r, "expert_compute_vs_ram", cmp, ram_read,
                         "expert bytes computed per second of expert compute (decode) / RAM "
                         "read probe MB/s at the run's threads"),
               runs, limits, "expert_compute_mb_s", 0);
    add_ratio(r, "expert_compute_vs_ram_triad", cmp, ram_triad,
              "the same / RAM triad MB/s (the STREAM figure)");
    /* a warm token reads its bytes at least once: decode tok/s against
     * RAM read bytes/s over bytes per token (issue 31's bound) */
    const double tok_mb = med_of(summary, "token_read_mb");
    pair_ratio(add_ratio(r, "decode_vs_ram_bound", med_of(summary, "decode_tok_s"),
                         tok_mb > 0 ? ram_read / tok_mb : NAN,
                         "decode tok/s / (RAM read probe MB/s / MB one warm token reads at "
                         "least: dense weights, the routed experts it uses, the KV rows it "
                         "attends over)"),
               runs, limits, "decode_tok_s", 1);
    /* a cold token reads from disk at least what the expert RAM cannot hold
     * (must_read_bytes): decode tok/s against fio MB/s over those bytes */
    const double least = med_of(summary, "decode_least_read_mb_per_token");
    json_t *db = add_ratio(r, "decode_vs_disk_bound", med_of(summary, "decode_tok_s"),
                           least > 0 ? fio / least : NAN,
                           "decode tok/s / (fio MB/s / MB a decode token reads at least: the "
                           "acquires of experts outside the most-used set that fits the "
                           "expert cache and pins)");
    jset(db, "decode_read_mb_per_token", jnum(med_of(summary, "decode_read_mb_per_token")));
    jset(db, "least_read_mb_per_token", jnum(least));
    jset(db, "fio_mb_s", jnum(fio));
    /* the busiest link: each worker's wire MB/s during decode over its own
     * link's throughput, the highest ratio */
    double wire = NAN, link = NAN, best = NAN;
    const char *busiest = NULL;
    size_t i;
    json_t *w;
    json_array_foreach(json_object_get(json_object_get(limits, "net"), "workers"), i, w) {
        const char *addr = json_string_value(json_object_get(w, "address"));
        char key[200];
        snprintf(key, sizeof key, "wire_mb_s@%s", addr ? addr : "");
        double fw = med_of(summary, key), lw = jget(w, "mb_per_s"), q = ratio(fw, lw);
        if (isfinite(q) && !(q <= best)) {
            best = q;
            wire = fw;
            link = lw;
            busiest = addr;
        }
    }
    json_t *x = add_ratio(r, "wire_vs_link", wire, link,
                          "wire MB/s (sent + received) during decode / bulk throughput of "
                          "the same link (Heartbeat payloads out and back), for the busiest "
                          "worker link");
    jset(x, "link", busiest ? json_string(busiest) : NULL);
    return r;
}

/* ---- printing ----------------------------------------------------------------------------- */

static void print_fig(const json_t *summary, const char *k, const char *name, double scale,
                      const char *fmt)
{
    const json_t *o = json_object_get(summary, k);
    if (!json_is_object(o))
        return;
    char a[32], b[32], c[32];
    snprintf(a, sizeof a, fmt, scale * jget(o, "median"));
    snprintf(b, sizeof b, fmt, scale * jget(o, "min"));
    snprintf(c, sizeof c, fmt, scale * jget(o, "max"));
    printf("  %-34s %10s %10s %10s\n", name, a, b, c);
}

/* o[k] as a string, or dflt when absent or not a string */
static const char *jstr(const json_t *o, const char *k, const char *dflt)
{
    const char *v = json_string_value(json_object_get(o, k));
    return v ? v : dflt;
}

static void print_report(const json_t *res)
{
    const json_t *m = json_object_get(res, "model"), *sum = json_object_get(res, "summary");
    const json_t *lim = json_object_get(res, "limits"), *rat = json_object_get(res, "ratios");
    const json_t *mach = json_object_get(res, "machine");
    const json_t *stor = json_object_get(mach, "storage");
    const char *label = jstr(res, "label", NULL);
    char what[64] = "limits only";
    if (json_object_get(res, "state"))
        snprintf(what, sizeof what, "%s, %lld reps",
                 jstr(json_object_get(res, "state"), "name", "?"),
                 (long long)json_integer_value(json_object_get(res, "reps")));
    printf("shoal bench%s%s: %s %s, %s; commit %s\n", label ? " " : "", label ? label : "",
           jstr(m, "model_type", "model"), jstr(m, "fingerprint", "(no fingerprint)"), what,
           jstr(res, "commit", "?"));
    printf("  machine: %s, %lld cores, %.1f GiB RAM, %s on %s\n", jstr(mach, "cpu", "?"),
           (long long)json_integer_value(json_object_get(mach, "cores")),
           jget(mach, "ram_bytes") / (1024.0 * 1024 * 1024), jstr(stor, "fstype", "?"),
           jstr(stor, "device", "?"));
    const json_t *ssd = json_object_get(lim, "ssd"), *ram = json_object_get(lim, "ram");
    const json_t *net = json_object_get(lim, "net");
    if (isfinite(jget(ssd, "mb_per_s")))
        printf("  limit ssd: fio %s QD%lld bs %lld: %.0f MB/s\n", jstr(ssd, "engine", "?"),
               (long long)json_integer_value(json_object_get(ssd, "iodepth")),
               (long long)json_integer_value(json_object_get(ssd, "bs")), jget(ssd, "mb_per_s"));
    else
        printf("  limit ssd: n/a (%s)\n",
               jstr(ssd, "skipped", jstr(ssd, "error", jstr(lim, "skipped", "not measured"))));
    if (isfinite(jget(ram, "read_gbs"))) {
        const double hs = jget(ram, "huge_page_share");
        char pages[64] = "";
        if (isfinite(hs) && hs >= 0)
            snprintf(pages, sizeof pages, " (%.0f %% on 2 MiB pages)", 100.0 * hs);
        printf("  limit ram: %lld threads: read %.1f, copy %.1f, triad %.1f GB/s%s\n",
               (long long)json_integer_value(json_object_get(ram, "threads")),
               jget(ram, "read_gbs"), jget(ram, "copy_gbs"), jget(ram, "triad_gbs"), pages);
    }
    else
        printf("  limit ram: n/a (%s)\n",
               jstr(ram, "skipped", jstr(ram, "error", jstr(lim, "skipped", "not measured"))));
    size_t iw;
    json_t *w;
    json_array_foreach(json_object_get(net, "workers"), iw, w) {
        if (isfinite(jget(w, "mb_per_s")))
            printf("  limit net %s: RTT %.3f ms (min %.3f), bulk %.0f MB/s\n",
                   jstr(w, "address", "?"), jget(w, "rtt_ms"), jget(w, "rtt_ms_min"),
                   jget(w, "mb_per_s"));
        else
            printf("  limit net %s: n/a (%s)\n", jstr(w, "address", "?"),
                   jstr(w, "error", "not measured"));
    }
    if (!json_object_size(sum))
        return;
    printf("  %-34s %10s %10s %10s\n", "figure", "median", "min", "max");
    print_fig(sum, "ttft_ms", "TTFT ms", 1, "%.1f");
    print_fig(sum, "prefill_tok_s", "prefill tok/s", 1, "%.2f");
    print_fig(sum, "decode_tok_s", "decode tok/s", 1, "%.2f");
    print_fig(sum, "ms_per_token", "decode ms/token", 1, "%.2f");
    print_fig(sum, "ms_attention", "  attention", 1, "%.2f");
    print_fig(sum, "ms_routing", "  routing", 1, "%.2f");
    print_fig(sum, "ms_expert_wait", "  waiting on experts", 1, "%.2f");
    print_fig(sum, "ms_expert_compute", "  expert compute", 1, "%.2f");
    print_fig(sum, "ms_network", "  network", 1, "%.2f");
    print_fig(sum, "ms_combine", "  combine", 1, "%.2f");
    print_fig(sum, "ms_head", "  head", 1, "%.2f");
    print_fig(sum, "ms_other", "  other (sampling, ...)", 1, "%.2f");
    print_fig(sum, "hit_rate", "expert hit rate %", 100, "%.1f");
    print_fig(sum, "hit_pinned", "  pinned %", 100, "%.1f");
    print_fig(sum, "hit_cache", "  cache %", 100, "%.1f");
    print_fig(sum, "hit_inflight", "  in-flight prefetch %", 100, "%.1f");
    print_fig(sum, "miss_disk", "  disk (miss) %", 100, "%.1f");
    print_fig(sum, "expert_read_mb", "expert MB read", 1, "%.1f");
    print_fig(sum, "expert_read_mb_s", "expert read MB/s (while reading)", 1, "%.0f");
    print_fig(sum, "expert_compute_mb_s", "expert compute MB/s", 1, "%.0f");
    print_fig(sum, "prefetch_precision", "prefetch precision %", 100, "%.1f");
    print_fig(sum, "prefetch_recall", "prefetch recall %", 100, "%.1f");
    print_fig(sum, "worker_hit_rate", "worker hit rate %", 100, "%.1f");
    print_fig(sum, "worker_read_mb_s", "worker read MB/s (while reading)", 1, "%.0f");
    print_fig(sum, "hit_rate_all", "hit rate, all executors %", 100, "%.1f");
    print_fig(sum, "wire_mb_s", "wire MB/s", 1, "%.1f");
    print_fig(sum, "peak_rss_mb", "peak RSS MB", 1, "%.0f");
    const char *names[] = {"expert_read_vs_ssd", "expert_compute_vs_ram", "wire_vs_link"};
    const char *labels[] = {"expert reads / fio", "expert compute / RAM read",
                            "wire / link"};
    for (int k = 0; k < 3; k++) {
        const json_t *x = json_object_get(rat, names[k]);
        if (isfinite(jget(x, "ratio")))
            printf("  ratio %-28s %10.2f  (%.0f / %.0f MB/s%s)\n", labels[k], jget(x, "ratio"),
                   jget(x, "figure"), jget(x, "limit"),
                   json_object_get(x, "paired") ? "; paired probes" : "");
    }
    print_fig(sum, "decode_read_mb_per_token", "decode MB read per token", 1, "%.1f");
    print_fig(sum, "decode_least_read_mb_per_token", "  least a cache this size reads", 1,
              "%.1f");
    const json_t *disk = json_object_get(rat, "decode_vs_disk_bound");
    if (isfinite(jget(disk, "ratio")))
        printf("  ratio %-28s %10.2f  (%.2f / %.2f tok/s: %.1f MB read a token, %.1f MB at "
               "least, at fio's %.0f MB/s)\n",
               "decode / disk bound", jget(disk, "ratio"), jget(disk, "figure"),
               jget(disk, "limit"), jget(disk, "decode_read_mb_per_token"),
               jget(disk, "least_read_mb_per_token"), jget(disk, "fio_mb_s"));
    const json_t *bound = json_object_get(rat, "decode_vs_ram_bound");
    if (isfinite(jget(bound, "ratio")))
        printf("  ratio %-28s %10.2f  (%.2f / %.2f tok/s: %.1f MB a token, %.1f of it KV, "
               "at the RAM read probe; meaningful warm)\n",
               "decode / RAM-read bound", jget(bound, "ratio"), jget(bound, "figure"),
               jget(bound, "limit"), med_of(sum, "token_read_mb"),
               med_of(sum, "token_kv_read_mb"));
    if (json_object_get(bound, "paired"))
        printf("  %-34s %10s  (each rep against the better read probe beside it: %.2f .. "
               "%.2f; probes %.1f .. %.1f GB/s)\n", "", "", jget(bound, "ratio_min"),
               jget(bound, "ratio_max"), jget(bound, "probe_read_gbs_min"),
               jget(bound, "probe_read_gbs_max"));
}

/* ---- the command ------------------------------------------------------------------------ */

static int read_prompts(const char *path, struct prompt_set *ps)
{
    struct shoal_err err = {0};
    char *text = NULL;
    size_t len = 0;
    if (shoal_read_file(path, 64u << 20, &text, &len, &err)) {
        shoal_cli_error("bench: --prompts: %s", err.msg);
        return -1;
    }
    size_t cap = 16;
    ps->lines = shoal_xmalloc(cap * sizeof *ps->lines);
    ps->n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r')
            line[--n] = '\0';
        if (!n || line[0] == '#')
            continue;
        if ((size_t)ps->n == cap) {
            cap *= 2;
            ps->lines = shoal_xrealloc(ps->lines, cap * sizeof *ps->lines);
        }
        ps->lines[ps->n++] = shoal_xstrdup(line);
    }
    free(text);
    if (ps->n == 0) {
        shoal_cli_error("bench: --prompts %s holds no prompt (one per line; '#' lines are "
                        "skipped)", path);
        return -1;
    }
    return 0;
}

static json_t *env_json(void)
{
    json_t *e = json_object();
    static const char *keys[] = {"OMP_WAIT_POLICY", "OMP_NUM_THREADS", "OMP_PROC_BIND",
                                 "GOMP_SPINCOUNT", "GLIBC_TUNABLES", "MALLOC_ARENA_MAX"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const char *v = getenv(keys[k]);
        if (v)
            jset(e, keys[k], json_string(v));
    }
    return e;
}

static json_t *config_json(const struct bench_opts *o)
{
    const struct shoal_session_opts *so = &o->so;
    json_t *c = json_object();
    jset(c, "threads", so->threads ? json_integer(so->threads) : json_string("default"));
    jset(c, "ctx", so->n_ctx ? json_integer(so->n_ctx) : json_string("default"));
    jset(c, "kv", json_string(so->kv >= 0 ? shoal_kv_dtype_name((enum shoal_dtype)so->kv)
                                          : "default"));
    jset(c, "batch", so->n_batch ? json_integer(so->n_batch) : json_string("default"));
    /* the kernel table the runs used: the CPU's best, or --isa's */
    jset(c, "isa", json_string(shoal_quant_ops_name()));
    jset(c, "expert_cache", so->expert_cache == ~0ull ? json_string("unlimited")
                                                      : json_integer((json_int_t)so->expert_cache));
    jset(c, "cache_policy",
         json_string(shoal_cache_policy_name((enum shoal_cache_policy)so->cache_policy)));
    jset(c, "pin", json_integer((json_int_t)so->pin));
    jset(c, "direct", json_boolean(so->direct));
    jset(c, "io", json_string(so->io == SHOAL_IO_PREAD ? "pread" :
                              so->io == SHOAL_IO_URING ? "uring" : "auto"));
    jset(c, "queue_depth", json_integer(so->queue_depth));
    jset(c, "prefetch", json_boolean(so->prefetch));
    json_t *mir = json_array();
    for (int i = 0; i < so->n_mirror; i++)
        json_array_append_new(mir, json_string(so->mirrors[i]));
    jset(c, "mirrors", mir);
    json_t *wk = json_array();
    for (int i = 0; i < so->n_workers_args; i++)
        json_array_append_new(wk, json_string(so->workers[i]));
    jset(c, "workers", wk);
    jset(c, "accept_workers", so->accept_workers ? json_string(so->accept_workers) : NULL);
    jset(c, "local_experts", json_boolean(so->local_experts));
    return c;
}

int shoal_cmd_bench(int argc, char **argv)
{
    struct bench_opts o;
    int rc = parse(&o, argc, argv);
    if (rc)
        return rc == 1 ? 0 : 2;
    /* no model given: the bundled one, as run; and fail before measuring
     * anything, not after minutes of runs */
    const int model_given = o.so.model_dir != NULL;
    if (!model_given)
        o.so.model_dir = shoal_cli_default_model();
    const int gguf = shoal_model_is_gguf(o.so.model_dir);
    if (!gguf && shoal_cli_check_model_dir(o.so.model_dir, model_given))
        return 2;
    if (gguf && (shoal_session_is_cluster(&o.so) || o.so.n_mirror > 0)) {
        /* as 'shoal run' refuses them, but before the limits are measured */
        shoal_cli_error("bench: '%s' is a GGUF file, whose experts are read from the file in "
                        "this process: --workers, --accept-workers and --mirror need a shoal "
                        "container", o.so.model_dir);
        return 2;
    }
    /* input files named on the command line: missing is a bad flag value */
    const char *const in_flag[2] = {"--prompts", "--limits"};
    const char *const in_path[2] = {
        o.prompts_file,
        o.limits && strcmp(o.limits, "on") && strcmp(o.limits, "off") ? o.limits : NULL};
    for (int k = 0; k < 2; k++)
        if (in_path[k] && (!shoal_exists(in_path[k]) || shoal_is_dir(in_path[k]))) {
            shoal_cli_error("bench: %s '%s' %s", in_flag[k], in_path[k],
                            shoal_is_dir(in_path[k]) ? "is a directory, not a file"
                                                     : "does not exist");
            return 2;
        }
    if (o.json_out) {
        /* writable where it is, or creatable in its directory; nothing is
         * created yet, so a failed bench leaves no empty file behind */
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", o.json_out);
        char *slash = strrchr(dir, '/');
        if (slash)
            *(slash == dir ? slash + 1 : slash) = 0;
        int ok = shoal_exists(o.json_out) ? access(o.json_out, W_OK) == 0
                                          : access(slash ? dir : ".", W_OK) == 0;
        if (!ok) {
            shoal_cli_error("bench: cannot write '%s': %s", o.json_out, strerror(errno));
            return 1;
        }
    }
    struct prompt_set ps = {0};
    if (o.prompts_file && !o.limits_only && read_prompts(o.prompts_file, &ps))
        return 1;
    if (!o.json_out)   /* after the checks above: an error stays one line */
        fprintf(stderr, "shoal: bench: no --json OUT; the result is only printed\n");
    json_t *res = json_object();
    char when[32];
    iso_now(when, sizeof when);
    jset(res, "schema", json_string(BENCH_SCHEMA));
    jset(res, "started", json_string(when));
    jset(res, "label", o.label ? json_string(o.label) : NULL);
    jset(res, "version", json_string(SHOAL_VERSION));
    jset(res, "commit", json_string(SHOAL_BENCH_COMMIT));
    char *cmd = command_line(argc + 1, argv - 1);   /* with "shoal" (argv[-1] is the program) */
    jset(res, "command", json_string(cmd));
    free(cmd);
    jset(res, "env", env_json());
    jset(res, "load_start", shoal_bench_loadavg());
    jset(res, "machine", shoal_bench_machine(o.so.model_dir));
    struct bench_model bm;
    json_t *mj = NULL;
    json_t *limits = NULL;
    const int md = model_describe(o.so.model_dir, &bm, &mj);
    if (md) {
        json_decref(res);
        rc = md == -2 ? 2 : 1;   /* -2: a GGUF shoal does not run (bad input) */
        goto free_prompts;
    }
    jset(res, "model", mj);
    jset(res, "config", config_json(&o));
    if (!strcmp(o.limits, "off"))
        limits = json_pack("{s:s}", "skipped", "--limits off");
    else if (!strcmp(o.limits, "on") || o.limits_only)
        limits = measure_limits(&o, &bm);
    else if (!(limits = load_limits(o.limits, mj))) {
        rc = 1;
        goto done;
    } else if (shoal_session_is_cluster(&o.so)) {
        /* the workers of this run are its own (bench/sweep starts them per
         * run): their links are measured now, whatever the file says */
        jset(limits, "net", measure_net(&o, &bm));
    }
    jset(res, "limits", json_incref(limits));
    if (o.limits_only)
        goto write;
    /* the state and how it is made */
    json_t *state = json_object();
    jset(state, "name", json_string(o.state == BENCH_WARM ? "warm" : "cold"));
    jset(state, "expert_caches", json_string(
        o.state == BENCH_WARM ? "kept from one unmeasured run of the same prompts in the same "
                                "process" : "empty: a fresh process per repetition"));
    jset(state, "page_cache", json_string(o.state == BENCH_WARM ? "as left by the warm-up run"
                                          : "made cold before each repetition (see evictions)"));
    if (shoal_session_is_cluster(&o.so))
        jset(state, "workers", json_string("worker processes keep their caches across "
                                           "repetitions: restart them for a cold state "
                                           "(bench/sweep does, per run); the worker_* "
                                           "figures cover the whole repetition (with "
                                           "--state warm, the warm-up too)"));
    json_t *evictions = json_array();
    jset(state, "evictions", evictions);
    jset(res, "state", state);
    jset(res, "prompts", json_pack("{s:s, s:I, s:I, s:I, s:I, s:s}", "source",
                                   o.prompts_file ? o.prompts_file : "random token ids",
                                   "count", (json_int_t)(ps.lines ? ps.n : o.n_prompts),
                                   "random_len", (json_int_t)o.prompt_len,
                                   "gen", (json_int_t)o.gen, "seed", (json_int_t)o.seed,
                                   "sampling", "default sampler (temp 0.8, top-k 40, top-p "
                                   "0.95, min-p 0.05) seeded per prompt; EOS ignored"));
    jset(res, "reps", json_integer(o.reps));
    json_t *runs = json_array();
    jset(res, "runs", runs);
    /* paired RAM probes: only beside a probe measured now */
    const int paired = o.paired_ram && !o.limits_only && !strcmp(o.limits, "on") &&
                       isfinite(jget(json_object_get(limits, "ram"), "read_gbs"));
    struct shoal_bench_ram_params rp = ram_params(&o);
    for (long long rep = 0; rep < o.reps; rep++) {
        if (o.state == BENCH_COLD && bm.gguf) {
            json_array_append_new(evictions, shoal_bench_evict((const char *const *)bm.files,
                                                               bm.n_files));
        } else if (o.state == BENCH_COLD) {
            const char *dirs[1 + SHOAL_MAX_MIRRORS];
            int nd = 0;
            dirs[nd++] = o.so.model_dir;
            for (int i = 0; i < o.so.n_mirror; i++)
                dirs[nd++] = o.so.mirrors[i];
            json_array_append_new(evictions, shoal_bench_evict(dirs, nd));
        }
        struct rep_job job = {.o = &o, .bm = &bm, .ps = &ps, .rep = (int)rep};
        struct shoal_err err = {0};
        char fp[32];
        struct shoal_bench_net_params np = net_params(&bm, fp);
        json_t *ws0 = bm.container ? shoal_bench_worker_status(&o.so, &np) : NULL;
        json_t *r = shoal_bench_fork_json(rep_child, &job, &err);
        if (!r)
            r = json_pack("{s:I, s:s}", "rep", (json_int_t)rep, "error", err.msg);
        json_t *ws1 = ws0 ? shoal_bench_worker_status(&o.so, &np) : NULL;
        add_worker_figures(r, ws0, ws1);
        json_decref(ws0);
        json_decref(ws1);
        const json_t *f = json_object_get(r, "figures");
        if (json_object_get(r, "error"))
            fprintf(stderr, "shoal: bench: rep %lld failed: %s\n", rep + 1,
                    json_string_value(json_object_get(r, "error")));
        else {
            /* no store (a Hugging Face directory): no hit rate to show */
            char hit[32] = "no expert store";
            if (isfinite(jget(f, "hit_rate")))
                snprintf(hit, sizeof hit, "hit rate %.1f%%", 100 * jget(f, "hit_rate"));
            fprintf(stderr, "shoal: bench: rep %lld/%lld: TTFT %.1f ms, prefill %.2f tok/s, "
                    "decode %.2f tok/s, %s, peak RSS %.0f MB\n", rep + 1, o.reps,
                    jget(f, "ttft_ms"), jget(f, "prefill_tok_s"), jget(f, "decode_tok_s"), hit,
                    jget(f, "peak_rss_mb"));
        }
        if (paired) {   /* the probe again, beside this repetition */
            json_t *ra = shoal_bench_ram(&rp);
            fprintf(stderr, "shoal: bench: RAM probe after rep %lld: read %.1f GB/s\n", rep + 1,
                    jget(ra, "read_gbs"));
            jset(r, "ram_after", ra);
        }
        json_array_append_new(runs, r);
    }
    size_t i;
    json_t *r;
    int n_ok = 0;
    const char *hash0 = NULL;
    int same = 1;
    json_array_foreach(runs, i, r) {
        if (json_object_get(r, "error"))
            continue;
        n_ok++;
        const char *h = json_string_value(json_object_get(r, "generated_ids_xxh64"));
        if (!hash0)
            hash0 = h;
        else if (h && strcmp(h, hash0))
            same = 0;
    }
    jset(res, "generated_ids_xxh64", hash0 ? json_string(hash0) : NULL);
    jset(res, "generated_ids_same_every_rep", json_boolean(same));
    json_t *summary = summarize(runs);
    jset(res, "summary", summary);
    jset(res, "ratios", ratios(summary, limits, runs));
    if (n_ok < o.reps)
        rc = 1;
write:
    jset(res, "load_end", shoal_bench_loadavg());
    iso_now(when, sizeof when);
    jset(res, "finished", json_string(when));
    print_report(res);
    if (o.json_out) {
        if (json_dump_file(res, o.json_out, JSON_INDENT(1)) != 0) {
            shoal_cli_error("bench: cannot write '%s': %s", o.json_out, strerror(errno));
            rc = 1;
        } else {
            printf("wrote %s\n", o.json_out);
        }
    }
done:
    json_decref(limits);
    json_decref(res);
    model_free(&bm);
free_prompts:
    if (ps.lines) {
        for (int64_t p = 0; p < ps.n; p++)
            free(ps.lines[p]);
        free(ps.lines);
    }
    return rc;
}
