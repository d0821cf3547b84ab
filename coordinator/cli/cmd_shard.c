/* shoal shard: split a container into one partial container (shard) per
 * worker, so that each machine stores only its share of the experts
 * (docs/FORMAT.md "Shards").
 *
 *   shoal shard --model DIR|FILE.gguf --shards N [--replicas R] [--weights w1,...]
 *               [--with-dense] [--force] --out OUT
 *
 * A GGUF file is first converted into OUT/model (every tensor keeping its
 * ggml type), which the coordinator runs and the shards are cut from.
 *
 * Expert (il, ie) goes to its R holders by weighted rendezvous hashing
 * (placement.h); OUT/worker-i is shard i and OUT/placement.json lists what
 * each shard holds and each expert's holders. Placement never changes a
 * result (DESIGN contract 1): it only decides where bytes live.
 * Thread: main.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "container.h"
#include "gguf_arch.h"
#include "hot_replicas.h"
#include "placement.h"
#include "util.h"

#define SHARD_MAX_WORKERS 4096

struct shard_args {
    const char *model, *out;
    int shards, replicas;
    double *weights;      /* [shards] or NULL (equal) */
    int n_weights;
    int with_dense, force;
    int hot_n, hot_extra; /* --hot-replicas H[:X]; hot_n 0: none */
    const char *routing;  /* --routing FILE, or NULL: the container's */
    int stride;           /* holders per expert at most: min(R + X, N) */
};

static void usage(FILE *f)
{
    fprintf(f, "usage: shoal shard [--model] DIR|FILE.gguf --shards N [--replicas R] "
               "[--hot-replicas H[:X]] [--routing FILE] [--weights w1,w2,...] [--with-dense] "
               "[--force] [--out] OUT\n\n"
               "Writes OUT/worker-0 .. OUT/worker-(N-1), one partial container per worker\n"
               "holding its share of the experts (R holders per expert, shares in proportion\n"
               "to the weights, by weighted rendezvous hashing), and OUT/placement.json.\n"
               "DIR must be a shoal container (make one with 'shoal convert'), or a GGUF\n"
               "file (any file of a split set): it is first converted into OUT/model, every\n"
               "tensor keeping its type, and the shards are cut from that container; run the\n"
               "coordinator on OUT/model (a GGUF's own fingerprint is not the container's).\n"
               "  --model DIR, DIR  the container, or the GGUF file, to shard\n"
               "  --out OUT, OUT    where the shards and placement.json go\n"
               "  --shards N        how many shards (one per worker)\n"
               "  --replicas R      holders per expert, 1..N (default 1)\n"
               "  --hot-replicas H[:X]  the H experts of each layer with the most routings\n"
               "                    get X more holders (default 1; as shoal-worker's flag)\n"
               "  --routing FILE    the counts that rank them (default: the container's\n"
               "                    synth.json, else its routing_counts.json)\n"
               "  --weights LIST    N positive numbers, e.g. disk or RAM sizes (default equal)\n"
               "  --with-dense      copy dense.bin too (a shard without it serves experts only)\n"
               "  --force           replace existing shards and placement.json\n");
}

/* "3,1,1" -> [3, 1, 1]; every item a positive finite number. */
static int parse_weights(const char *s, struct shard_args *a)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    a->weights = shoal_xcalloc(cap, sizeof *a->weights);
    a->n_weights = 0;
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item) {
            shoal_cli_error("shard: --weights item %d is %s; expected a positive number",
                            a->n_weights + 1, len ? "too long" : "empty");
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        char *end = NULL;
        errno = 0;
        double v = strtod(item, &end);
        if (*end || errno || !isfinite(v) || !(v > 0)) {
            shoal_cli_error("shard: --weights item %d is '%s'; expected a positive number",
                            a->n_weights + 1, item);
            return -1;
        }
        a->weights[a->n_weights++] = v;
        if (!comma)
            break;
        p = comma + 1;
    }
    return 0;
}

/* Returns 0, 1 after --help (exit 0), or -1 after a one-line error (exit 2). */
static int parse_args(int argc, char **argv, struct shard_args *a)
{
    long long shards = 0, replicas = 1;
    int have_shards = 0;
    const char *weights = NULL;
    char *words[2];
    int n_words = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            usage(stdout);
            return 1;
        }
        if (!strcmp(f, "--with-dense")) {
            a->with_dense = 1;
            continue;
        }
        if (!strcmp(f, "--force")) {
            a->force = 1;
            continue;
        }
        if (f[0] != '-' && n_words < 2) {
            words[n_words++] = argv[i];   /* [--model] DIR [--out] OUT */
            continue;
        }
        if (!strcmp(f, "--workers")) {
            /* --workers is a list of worker addresses in run, chat, serve and
             * bench: here the same name for a count would be a second meaning */
            shoal_cli_error("shard: --workers is a list of worker addresses in run/chat/"
                            "serve/bench; the number of shards is --shards N");
            return -1;
        }
        if (strcmp(f, "--model") && strcmp(f, "--out") && strcmp(f, "--shards") &&
            strcmp(f, "--replicas") && strcmp(f, "--weights") && strcmp(f, "--hot-replicas") &&
            strcmp(f, "--routing")) {
            shoal_cli_error("shard: unknown %s '%s' (see 'shoal shard --help')",
                            f[0] == '-' ? "option" : "argument", f);
            return -1;
        }
        if (i + 1 >= argc) {
            shoal_cli_error("shard: %s needs a value", f);
            return -1;
        }
        const char *v = argv[++i];
        if (!strcmp(f, "--model")) {
            a->model = v;
        } else if (!strcmp(f, "--out")) {
            a->out = v;
        } else if (!strcmp(f, "--weights")) {
            weights = v;
        } else if (!strcmp(f, "--routing")) {
            a->routing = v;
        } else if (!strcmp(f, "--hot-replicas")) {
            if (shoal_hot_replicas_parse(v, SHARD_MAX_WORKERS, &a->hot_n, &a->hot_extra)) {
                shoal_cli_error("shard: --hot-replicas expects H or H:X with H >= 1 (hot "
                                "experts per layer) and 1 <= X <= %d (extra holders each), "
                                "got '%s'", SHARD_MAX_WORKERS, v);
                return -1;
            }
        } else if (!strcmp(f, "--shards")) {
            if (shoal_cli_parse_i64("--shards", v, 1, SHARD_MAX_WORKERS, &shards))
                return -1;
            have_shards = 1;
        } else if (shoal_cli_parse_i64("--replicas", v, 1, SHARD_MAX_WORKERS, &replicas)) {
            return -1;
        }
    }
    const struct shoal_cli_slot slots[] = {{"--model", &a->model}, {"--out", &a->out}};
    if (shoal_cli_assign_paths("shard", words, n_words, slots, 2))
        return -1;
    if (!a->model) {
        shoal_cli_error("shard: --model DIR is required (the container to shard)");
        return -1;
    }
    if (!have_shards) {
        shoal_cli_error("shard: --shards N is required (how many shards, one per worker)");
        return -1;
    }
    if (!a->out) {
        shoal_cli_error("shard: --out DIR is required (where worker-0 .. worker-%lld go)",
                        shards - 1);
        return -1;
    }
    if (replicas > shards) {
        shoal_cli_error("shard: --replicas %lld exceeds --shards %lld; expected 1..%lld",
                        replicas, shards, shards);
        return -1;
    }
    a->shards = (int)shards;
    a->replicas = (int)replicas;
    a->stride = a->hot_n && a->replicas + a->hot_extra < a->shards
                    ? a->replicas + a->hot_extra
                    : a->hot_n ? a->shards : a->replicas;
    if (a->routing && !a->hot_n) {
        shoal_cli_error("shard: --routing ranks the experts of --hot-replicas; give that too");
        return -1;
    }
    if (weights) {
        if (parse_weights(weights, a))
            return -1;
        if (a->n_weights != a->shards) {
            shoal_cli_error("shard: --weights has %d values for --shards %d; expected one "
                            "per shard", a->n_weights, a->shards);
            return -1;
        }
    }
    return 0;
}

static char *shard_dir(const char *out, int i)
{
    char name[32];
    snprintf(name, sizeof name, "worker-%d", i);
    return shoal_path_join(out, name);
}

/* Nothing is written unless every output may be: existing shards and
 * placement.json need --force. */
static int check_outputs(const struct shard_args *a)
{
    if (shoal_exists(a->out) && !shoal_is_dir(a->out)) {
        shoal_cli_error("shard: --out '%s' exists and is not a directory", a->out);
        return -1;
    }
    for (int i = 0; i <= a->shards; i++) {
        char *p = i < a->shards ? shard_dir(a->out, i)
                                 : shoal_path_join(a->out, "placement.json");
        int exists = shoal_exists(p);
        if (exists && !a->force)
            shoal_cli_error("shard: '%s' already exists; pass --force to replace it", p);
        free(p);
        if (exists && !a->force)
            return -1;
    }
    if (!shoal_exists(a->out) && mkdir(a->out, 0755) != 0) {
        shoal_cli_error("shard: cannot create '%s': %s", a->out, strerror(errno));
        return -1;
    }
    return 0;
}

/* placement.json: what each shard holds and each expert's holders (first
 * = highest score). Written beside the shards, atomically. */
static int write_placement(const struct shard_args *a, const struct shoal_container *ct,
                           const int *holders, const int *n_holders, const int64_t *n_exp,
                           const uint64_t *bytes, struct shoal_err *err)
{
    const int64_t NE = ct->n_expert, R = a->stride;
    char fp[17];
    snprintf(fp, sizeof fp, "%016" PRIx64, ct->fingerprint);
    json_t *weights = json_array(), *shards = json_array(), *layers = json_array();
    for (int i = 0; i < a->shards; i++) {
        json_array_append_new(weights, json_real(a->weights ? a->weights[i] : 1.0));
        char name[32];
        snprintf(name, sizeof name, "worker-%d", i);
        json_array_append_new(shards, json_pack("{s:i, s:s, s:I, s:I}", "index", i,
                                                "dir", name, "experts", (json_int_t)n_exp[i],
                                                "bytes", (json_int_t)bytes[i]));
    }
    for (int64_t il = 0; il < ct->n_layer; il++) {
        if (ct->layer_offset[il] == UINT64_MAX)
            continue;
        json_t *per = json_array();
        for (int64_t ie = 0; ie < NE; ie++) {
            json_t *h = json_array();
            for (int r = 0; r < n_holders[il * NE + ie]; r++)
                json_array_append_new(h, json_integer(holders[(il * NE + ie) * R + r]));
            json_array_append_new(per, h);
        }
        json_array_append_new(layers, json_pack("{s:I, s:o}", "layer", (json_int_t)il,
                                                "holders", per));
    }
    json_t *root = json_pack("{s:s, s:i, s:s, s:s, s:i, s:i, s:o, s:b, s:o, s:o}",
                             "format", "shoal-placement", "version", 1, "fingerprint", fp,
                             "model", ct->dir, "workers", a->shards, "replicas", a->replicas,
                             "weights", weights, "dense", a->with_dense != 0,
                             "shards", shards, "experts", layers);
    if (a->hot_n)   /* the hot experts are those with more than "replicas" holders */
        json_object_set_new(root, "hot_replicas",
                            json_pack("{s:i, s:i}", "hot", a->hot_n, "extra", a->hot_extra));
    char *path = shoal_path_join(a->out, "placement.json");
    size_t n = strlen(path) + 32;
    char *tmp = shoal_xmalloc(n);
    snprintf(tmp, n, "%s.tmp-%ld", path, (long)getpid());
    int rc = 0;
    if (!root || json_dump_file(root, tmp, JSON_INDENT(1)) != 0)
        rc = shoal_err_set(err, SHOAL_EIO, "cannot write '%s'", tmp);
    else if (rename(tmp, path) != 0)
        rc = shoal_err_set(err, -errno, "cannot publish '%s': %s", path, strerror(errno));
    if (rc)
        unlink(tmp);
    json_decref(root);
    free(tmp);
    free(path);
    return rc;
}

struct progress {
    int tty, index, count;
};

static void show_progress(uint64_t done, uint64_t total, void *user)
{
    const struct progress *p = user;
    if (p->tty)
        fprintf(stderr, "\rshard %d/%d: %5.1f%%  %.1f/%.1f MB   ", p->index + 1, p->count,
                total ? 100.0 * (double)done / (double)total : 100.0, (double)done / 1e6,
                (double)total / 1e6);
}

/* shoal shard FILE.gguf: convert it (every tensor keeps its type) into
 * OUT/model, the full container the coordinator runs and the shards are
 * cut from; *dir is that path (malloc'd). Returns 0 or the exit status
 * after printing the error (2 for a bad GGUF, as shoal convert). */
static int convert_gguf(const struct shard_args *a, char **dir)
{
    *dir = NULL;
    if (check_outputs(a))
        return 2;
    struct shoal_err err = {0};
    struct shoal_model *m = shoal_model_load(a->model, &err);
    if (!m) {
        shoal_cli_error("shard: %s", err.msg);
        return shoal_err_is_bad_input(err.code) ? 2 : 1;
    }
    struct shoal_convert_params p = shoal_convert_params_default();
    p.experts_dtype = p.dense_dtype = SHOAL_DTYPE_GGML;
    p.force = a->force;
    char *out = shoal_path_join(a->out, "model");
    const double t0 = shoal_time_s();
    const int rc = shoal_container_convert(m, a->model, out, &p, &err);
    shoal_model_free(m);
    if (rc) {
        shoal_cli_error("shard: %s", err.msg);
        free(out);
        return shoal_err_is_bad_input(rc) ? 2 : 1;
    }
    fprintf(stderr, "shoal: shard: converted %s into %s in %.1f s (the coordinator runs "
            "there; its types are the GGUF's)\n", a->model, out, shoal_time_s() - t0);
    *dir = out;
    return 0;
}

static int shard_container(struct shard_args a);

int shoal_cmd_shard(int argc, char **argv)
{
    struct shard_args a = {0};
    int prc = parse_args(argc, argv, &a);
    if (prc) {
        free(a.weights);
        return prc > 0 ? 0 : 2;
    }
    if (!shoal_model_is_gguf(a.model))
        return shard_container(a);
    char *dir = NULL;
    int rc = convert_gguf(&a, &dir);
    if (rc) {
        free(a.weights);
        return rc;
    }
    a.model = dir;
    rc = shard_container(a);   /* frees a.weights */
    free(dir);
    return rc;
}

/* Shard the container a.model (frees a.weights). */
static int shard_container(struct shard_args a)
{
    if (!shoal_container_is(a.model)) {
        char *cfg = shoal_path_join(a.model, "config.json");
        if (shoal_exists(cfg))
            shoal_cli_error("shard: '%s' is a Hugging Face checkpoint, not a shoal container; "
                            "run 'shoal convert %s DIR' first and shard DIR", a.model, a.model);
        else
            shoal_cli_check_model_dir(a.model, 1);   /* says what it is instead */
        free(cfg);
        free(a.weights);
        return 2;
    }
    struct shoal_err err = {0};
    struct shoal_model_config cfg;
    struct shoal_container *ct = shoal_container_open(a.model, &cfg, &err);
    if (!ct) {
        shoal_cli_error("shard: %s", err.msg);
        free(a.weights);
        return 1;
    }
    int rc = 0;
    if (ct->shard.count) {
        shoal_cli_error("shard: '%s' is already shard %d of %d; shard the full container",
                        a.model, ct->shard.index, ct->shard.count);
        rc = 2;
    } else if (a.with_dense && !ct->dense_map) {
        shoal_cli_error("shard: '%s' has no dense.bin for --with-dense", a.model);
        rc = 2;
    } else if (check_outputs(&a)) {
        rc = 2;
    }
    if (rc) {
        shoal_container_close(ct);
        free(a.weights);
        return rc;
    }

    /* placement: every expert's holders, then each worker's held set */
    const int64_t NE = ct->n_expert, total = ct->n_layer * NE;
    const int W = a.shards, R = a.replicas, RM = a.stride;
    uint8_t *hot = NULL;
    if (a.hot_n) {
        /* the hottest experts by the counts the workers would read */
        hot = shoal_hot_replicas_build(a.routing, ct->dir, ct->n_layer, NE, a.hot_n, &err);
        if (!hot) {
            shoal_cli_error("shard: --hot-replicas: %s", err.msg);
            shoal_container_close(ct);
            free(a.weights);
            return 2;
        }
    }
    int *holders = shoal_xcalloc((size_t)total * (size_t)RM + 1, sizeof *holders);
    int *n_holders = shoal_xcalloc((size_t)total + 1, sizeof *n_holders);
    uint8_t *held = shoal_xcalloc((size_t)total * (size_t)W + 1, 1);
    int64_t *n_exp = shoal_xcalloc((size_t)W, sizeof *n_exp);
    uint64_t *bytes = shoal_xcalloc((size_t)W, sizeof *bytes);
    for (int64_t il = 0; il < ct->n_layer; il++) {
        for (int64_t ie = 0; ie < NE; ie++) {
            if (!shoal_container_holds(ct, il, ie))
                continue;
            int *h = &holders[(il * NE + ie) * RM];
            const int r_ie = hot && hot[il * NE + ie] ? R + a.hot_extra : R;
            int n = shoal_placement_holders(il, ie, W, a.weights, r_ie > RM ? RM : r_ie, h);
            n_holders[il * NE + ie] = n;
            for (int r = 0; r < n; r++) {
                held[(size_t)h[r] * (size_t)total + (size_t)(il * NE + ie)] = 1;
                n_exp[h[r]]++;
            }
        }
    }

    const double t0 = shoal_time_s();
    const int tty = isatty(2);
    for (int i = 0; i < W && !rc; i++) {
        char *dir = shard_dir(a.out, i);
        struct progress pr = {.tty = tty, .index = i, .count = W};
        struct shoal_shard_params sp = {.index = i, .count = W, .replicas = R,
                                        .weights = a.weights,
                                        .held = &held[(size_t)i * (size_t)total],
                                        .with_dense = a.with_dense, .force = a.force,
                                        .progress = show_progress, .progress_user = &pr};
        if (shoal_container_write_shard(ct, dir, &sp, &bytes[i], &err)) {
            if (tty)
                fprintf(stderr, "\n");
            shoal_cli_error("shard: %s: %s", dir, err.msg);
            rc = 1;
        }
        free(dir);
    }
    if (tty && !rc)
        fprintf(stderr, "\n");
    if (!rc && write_placement(&a, ct, holders, n_holders, n_exp, bytes, &err)) {
        shoal_cli_error("shard: %s", err.msg);
        rc = 1;
    }
    if (!rc) {
        printf("sharded %s (fingerprint %016" PRIx64 ") into %d shards, %d replica%s, in "
               "%.1f s\n", a.model, ct->fingerprint, W, R, R == 1 ? "" : "s",
               shoal_time_s() - t0);
        printf("%-6s %-10s %8s %7s %10s\n", "worker", "weight", "experts", "share", "GB");
        for (int i = 0; i < W; i++)
            printf("%-6d %-10g %8lld %6.1f%% %10.3f  %s/worker-%d\n", i,
                   a.weights ? a.weights[i] : 1.0, (long long)n_exp[i],
                   ct->n_moe_expert ? 100.0 * (double)n_exp[i] / (double)ct->n_moe_expert : 0,
                   (double)bytes[i] / 1e9, a.out, i);
        char hot_note[96] = "";
        if (a.hot_n)
            snprintf(hot_note, sizeof hot_note, "; the %d hottest of each layer on %d more",
                     a.hot_n, RM - R);
        printf("placement: %s/placement.json (%lld experts, each on %d shard%s%s%s)\n", a.out,
               (long long)ct->n_moe_expert, R, R == 1 ? "" : "s", hot_note,
               a.with_dense ? "; dense tensors in every shard" : "");
        /* shards of an earlier, wider sharding are not this placement's:
         * say so rather than delete what may be in use */
        for (int i = W; i < SHARD_MAX_WORKERS; i++) {
            char name[32];
            snprintf(name, sizeof name, "worker-%d", i);
            char *old_dir = shoal_path_join(a.out, name);
            int there = shoal_is_dir(old_dir);
            if (there)
                fprintf(stderr, "shoal: shard: warning: %s is left from an earlier sharding "
                        "and is not part of this placement; remove it\n", old_dir);
            free(old_dir);
            if (!there)
                break;
        }
    }
    free(holders);
    free(hot);
    free(n_holders);
    free(held);
    free(n_exp);
    free(bytes);
    shoal_container_close(ct);
    free(a.weights);
    return rc;
}

/* "0-3 5 7-9": the ids of layer il the shard holds, as ranges. */
static void print_ranges(const struct shoal_container *ct, int64_t il)
{
    const int64_t NE = ct->n_expert;
    for (int64_t ie = 0; ie < NE; ie++) {
        if (!shoal_container_holds(ct, il, ie))
            continue;
        int64_t end = ie;
        while (end + 1 < NE && shoal_container_holds(ct, il, end + 1))
            end++;
        if (end == ie)
            printf(" %lld", (long long)ie);
        else
            printf(" %lld-%lld", (long long)ie, (long long)end);
        ie = end;
    }
}

void shoal_cli_print_shard(const struct shoal_container *ct)
{
    if (!ct->shard.count)
        return;
    printf("shard        index %d of %d shards, %d replica%s per expert, weights",
           ct->shard.index, ct->shard.count, ct->shard.replicas,
           ct->shard.replicas == 1 ? "" : "s");
    for (int i = 0; i < ct->shard.count; i++)
        printf("%s%g", i ? "," : " ", ct->shard.weights[i]);
    printf("\nholds        %lld of %lld experts (%.1f%%), %.1f MB; dense tensors: %s\n",
           (long long)ct->n_held, (long long)ct->n_moe_expert,
           ct->n_moe_expert ? 100.0 * (double)ct->n_held / (double)ct->n_moe_expert : 0.0,
           (double)ct->n_held * (double)ct->blob_bytes / 1e6,
           ct->shard.has_dense ? "yes (dense.bin)" : "no (serves experts only)");
    for (int64_t il = 0; il < ct->n_layer; il++) {
        if (ct->layer_offset[il] == UINT64_MAX)
            continue;
        int64_t n = 0;
        for (int64_t ie = 0; ie < ct->n_expert; ie++)
            n += shoal_container_holds(ct, il, ie);
        printf("  layer %-4lld %lld/%lld:", (long long)il, (long long)n,
               (long long)ct->n_expert);
        if (n)
            print_ranges(ct, il);
        else
            printf(" (none)");
        printf("\n");
    }
}
