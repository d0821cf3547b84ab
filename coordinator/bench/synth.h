/* synth: what the files of `shoal synth` share (internal to
 * coordinator/bench/). Synthetic containers for benchmarks
 * (docs/BENCHMARKS.md).
 *
 *   shoal synth DST --gb N [--family F | --config FILE] [--experts T] ...
 *       writes a container (docs/FORMAT.md) of a real architecture's shapes,
 *       scaled in layer count to about N GB, with random but well-formed
 *       weights, straight from a seeded generator (no checkpoint, no
 *       quantization pass): the same options give the same bytes.
 *   shoal synth --check DIR [run/store flags] [--decode N] ...
 *       decodes on a container and reports finite logits, per-stage
 *       timings of a measured window, and (for synthetic containers) the
 *       achieved expert frequencies against the target ones.
 *
 * Routing. The generated model routes like a real one in distribution: the
 * per-expert frequencies of a real routing trace (shared/data/traces, OLMoE
 * or Mixtral counts; see SOURCES.md §4) are stretched to n_expert and
 * permuted per layer. Channel c0 = n_embd-1 of the residual stream carries
 * a constant C = sqrt(n_embd-1) (embedding column c0); nothing writes to it
 * (the c0 rows of attn_output, of every w_down are zero) and the norms
 * before attention and lm_head zero it, so after ffn_norm it is a positive
 * per-layer constant u0. Router row e holds b_e / u0 at c0 and small
 * random weights elsewhere, so its logit is b_e + z_e with z_e ~ N(0, 1)
 * varying with the token. b is calibrated by Monte Carlo, routing b + z
 * through the engine's own router (shoal_router_select: softmax or sigmoid
 * scores, DeepSeek's group limits; the router_bias written is zero), so
 * that the top-k inclusion frequencies match the trace. The expected growth
 * of the residual (every MoE block adds about --drift rms per channel) is
 * compensated layer by layer. Tokens are routed independently of each
 * other (no temporal locality beyond what the sampled text repeats).
 *
 * The files, by job:
 *   cmd_synth.c      the command: flags, the family and its shapes scaled to
 *                    --gb, what it prints
 *   synth_config.c   the families: built-in shapes or a real config.json as
 *                    the template, the config.json written (parsed back with
 *                    the shared parser), the container's bytes measured with
 *                    the converter's layout rules (container_write.h)
 *   synth_routing.c  the routing trace's target shares, the Monte Carlo
 *                    calibration of the router biases, the per-layer plan
 *   synth_write.c    the seeded weights, the expert writer thread, the
 *                    files, manifest and fingerprint (container_write.h)
 *   synth_check.c    --check: decode on a container and measure
 *
 * Thread: main (generation opens OpenMP regions; synth_write starts one
 * writer thread of its own).
 */
#ifndef SHOAL_SYNTH_H
#define SHOAL_SYNTH_H

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "container_write.h"
#include "err.h"
#include "model_config.h"
#include "tensor.h"

#define MC_TOKENS 32768          /* Monte Carlo tokens for the router calibration */

/* ---- random numbers (splitmix64: fast, seekable by key) ------------------ */

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

struct rng {
    uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
    r->s += 0x9e3779b97f4a7c15ULL;
    return mix64(r->s);
}

/* An independent stream per (seed, a, b, c). */
static inline struct rng rng_for(uint64_t seed, uint64_t a, uint64_t b, uint64_t c)
{
    struct rng r = {mix64(seed ^ mix64(a ^ mix64(b ^ mix64(c + 0x5eedULL))))};
    return r;
}

/* uniform in [0, 1) with 24 bits */
static inline float rng_unit(struct rng *r)
{
    return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

/* uniform in [-1, 1) */
static inline float rng_sym(struct rng *r)
{
    return 2.0f * rng_unit(r) - 1.0f;
}

static inline double rng_normal(struct rng *r)
{
    double u1 = ((double)(rng_next(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline uint64_t str_hash(const char *s)
{
    return XXH64(s, strlen(s), 0x5ca1ab1eULL);
}

/* ---- architectures (synth_config.c) ------------------------------------------ */

/* A built-in family's real shapes (the config.json make_config writes). */
struct fam_shape;

struct shape {
    int64_t hidden, heads, kv_heads, head_dim, moe_ff, n_expert, top_k, shexp_ff;
    int64_t vocab, layers;
    /* template families only (0 where the config has no such key) */
    int64_t ff;                   /* dense MLP intermediate_size */
    int64_t q_lora, kv_lora, rope_dim;  /* MLA ranks, qk_rope_head_dim */
    int64_t n_group, topk_group;
    int64_t dense_layers;         /* first_k_dense_replace written */
};

/* The built-in family model_type, or NULL. */
const struct fam_shape *synth_fam_find(const char *model_type);

/* The template config.json of family model_type (a real checkpoint's; new
 * reference), or NULL. */
json_t *synth_tmpl_find(const char *model_type);

/* The families --family takes, as "a, b, ... or z". */
const char *synth_family_names(void);

/* The real shapes of a built-in family, and of a template config (f: its
 * family). */
void synth_shape_of_fam(const struct fam_shape *f, struct shape *s);
void synth_shape_of_tmpl(const json_t *t, const struct shoal_family *f, struct shape *s);

/* The config.json written: a built-in family's with shapes s, or a copy of
 * template t with shapes s (new references). */
json_t *synth_make_config(const struct fam_shape *f, const struct shape *s);
json_t *synth_apply_shapes(const json_t *t, const struct shoal_family *f,
                           const struct shape *s);

/* Parse a written config with the shared parser (shoal_model_config_parse). */
int synth_parse_config(json_t *config, struct shoal_model_config *cfg, struct shoal_err *err);

/* Lay out cfg's container as the converter would (container_write.h) into
 * *l. Returns the container's bytes (dense.bin and experts.bin). */
uint64_t synth_measure(const struct shoal_model_config *cfg, enum shoal_dtype experts,
                       enum shoal_dtype dense, int group, struct shoal_container_layout *l);

/* ---- routing (synth_routing.c) ------------------------------------------------ */

struct trace {
    const char *name;   /* olmoe, mixtral, uniform, zipf */
    int n_src;          /* source layers (1 for built-ins) */
    int src_layer[3];   /* trace layer index, e.g. 0 7 15 */
    int src_n_layer;    /* the traced model's layers (OLMoE 16, Mixtral 32); 0: built in */
    double src_depth[3];/* relative depth of each in its model, 0..1 */
    double *shares[3];  /* [n_src][n_expert] stretched, sorted descending */
};

void synth_trace_free(struct trace *t);

struct synth {
    /* options */
    struct shape sh;
    enum shoal_dtype experts_dtype, dense_dtype;
    int group;
    uint64_t seed;
    double drift;
    const char *domain;          /* the trace's domain, or all */
    int tty;
    /* architecture */
    json_t *config;
    struct shoal_model_config cfg;
    int64_t c0;
    double C;                    /* value of the constant channel */
    double p_att;                /* variance attention adds to the residual per channel */
    double var_ffn_out, var_dense_out, var_head, var_exp_out;
    double *var_att_in;          /* [n_layer] q/k/v weight variance: unit-variance outputs */
    /* routing */
    struct trace trace;
    int *layer_src;              /* [n_layer] trace layer used */
    double *layer_target;        /* [n_layer][n_expert] target shares (permuted) */
    double *layer_bias;          /* [n_layer][n_expert] calibrated logit biases */
    double *u0;                  /* [n_layer] expected value of channel c0 after ffn_norm */
    double *sigma;               /* [n_layer] router weight scale off c0; sigma^2 is also the
                                  * gate/up weight variance that gives unit-variance
                                  * pre-activations whatever share c0 has at that depth */
    double mean_w2[3], calib_err[3];
    double layer_err;            /* grouped routers: worst inclusion error of the per-layer fits */
    int n_layer_fits;
    /* writer */
    struct shoal_err *err;
    int fd_dense, fd_exp;
    char *dense_path, *exp_path;
    struct shoal_container_layout lay;   /* the whole container, measured first */
    struct shoal_container_layout written;  /* the dense tensors written so far */
    uint64_t exp_off;
    json_t *tensors, *layers;
    XXH64_state_t *fp;
    float *rowbuf;
    size_t rowbuf_cap;
    unsigned char *chunk;
    size_t chunk_cap;
    unsigned char *bufs[2];      /* expert batches: one generated while the other is written */
    int cur;
    uint64_t *sums;
    int64_t batch_blobs;
    int exp_direct;              /* experts.bin opened with O_DIRECT */
    uint64_t done, total;
    double t0, t_gen, t_write;   /* generating; waiting for the writer */
    /* the expert writer thread */
    pthread_t wthread;
    int wstarted;
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    const unsigned char *wbuf;
    size_t wlen;
    uint64_t woff;
    int wpending, wquit, wrc, wmu_init;
    struct shoal_err werr;
    double wbusy;
};


/* Per-layer routing plan into sy (synth_routing.c): the trace's shares by
 * depth, a seeded permutation of experts, calibrated biases, the residual's
 * expected statistics. Returns 0 or an error code with sy->err set. */
int synth_plan_routing(struct synth *sy, const char *trace_name, const char *trace_file,
                       const char *domain, double zipf_s);

/* Write sy's container to dst (synth_write.c): a temporary directory beside
 * it, published when complete (force: over an existing container). argv:
 * the command, recorded in synth.json. Prints what went wrong; returns the
 * exit status. */
int synth_write(struct synth *sy, const char *dst, int force, int argc, char **argv);

/* Free what sy holds (its config, trace and routing plan). */
void synth_free(struct synth *sy);

/* `shoal synth --help` (cmd_synth.c) and `shoal synth --check` (synth_check.c). */
void synth_usage(FILE *f);
int synth_check_main(int argc, char **argv);

#endif
