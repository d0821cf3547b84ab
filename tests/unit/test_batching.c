/* Contract 1 across batch-mates (forward.h, shoal_ctx_eval_segs): a
 * sequence's logits bytes are the same whether it runs alone (shoal_ctx_eval,
 * prefill in one chunk, then one token per decode step) or inside
 * multi-sequence steps beside other sequences, its prompt cut into other
 * chunks, its decode tokens sharing a step with other prompts' chunks, its
 * prefix copied from another sequence's cache.
 *
 * Assert kind (STYLE 35): bit-exact (memcmp of every logits row). The
 * bundled model (models/shakespeare-moe: 4 MoE layers x 8 experts, bf16)
 * as shipped, and converted to an INT4A8 container whose experts come from
 * the expert store (the int8-activation GEMM for rows > 1, the matvec for
 * one row). Greedy decode, so a single differing bit would also change the
 * tokens that follow. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "container.h"
#include "expert_store.h"
#include "forward.h"
#include "model.h"
#include "test_fs.h"

#define MODEL_DIR SHOAL_SOURCE_ROOT "/models/shakespeare-moe"
#define N_SEQ 4
#define N_DEC 6

/* One sequence: its prompt, and what it produced: N_DEC + 1 logits rows
 * (after the prompt, then after each fed token) and N_DEC greedy tokens. */
struct seqrun {
    int32_t prompt[64];
    int64_t n_prompt;
    float *logits;          /* [N_DEC + 1][V] */
    int32_t gen[N_DEC];
};

static int32_t argmax(const float *x, int64_t n)
{
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return (int32_t)b;
}

/* A prompt of n ids from a fixed xorshift stream; shared_with/n_shared: its
 * first n_shared ids copied from another prompt (a shared system prompt). */
static void make_prompt(struct seqrun *r, int64_t n, uint32_t seed, int64_t n_vocab,
                        const struct seqrun *shared_with, int64_t n_shared)
{
    r->n_prompt = n;
    for (int64_t i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        r->prompt[i] = i < n_shared ? shared_with->prompt[i] : (int32_t)(seed % n_vocab);
    }
}

/* A context of one sequence, 128 tokens, KV elements kv. */
static struct shoal_ctx *one_seq_ctx(struct shoal_model *m, enum shoal_dtype kv)
{
    struct shoal_err err = {0};
    struct shoal_ctx_params p = shoal_ctx_params_default();
    p.n_ctx = 128;
    p.kv_dtype = kv;
    struct shoal_ctx *ctx = shoal_ctx_create(m, p, &err);
    cr_assert(ctx != NULL, "%s", err.msg);
    return ctx;
}

/* The sequence alone: its prompt in one eval, then N_DEC greedy steps. */
static void run_solo(struct shoal_model *m, struct seqrun *r, enum shoal_dtype kv)
{
    const int64_t V = m->cfg.n_vocab;
    struct shoal_err err = {0};
    struct shoal_ctx *ctx = one_seq_ctx(m, kv);
    r->logits = malloc((size_t)((N_DEC + 1) * V) * sizeof(float));
    cr_assert(eq(int, shoal_ctx_eval(ctx, r->prompt, r->n_prompt, r->logits, 0, &err), 0),
              "%s", err.msg);
    for (int s = 0; s < N_DEC; s++) {
        r->gen[s] = argmax(r->logits + s * V, V);
        cr_assert(eq(int, shoal_ctx_eval(ctx, &r->gen[s], 1, r->logits + (s + 1) * V, 0, &err),
                     0), "%s", err.msg);
    }
    shoal_ctx_free(ctx);
}

/* Speculative decoding's verify steps (coordinator/cli/generate_loop.c):
 * after the prompt, steps of up to 4 rows, the fed token and drafts of
 * which the last is wrong; each row before the wrong one must be solo's
 * logits after that token, bit for bit; the cache then drops the wrong
 * draft (truncate) and its KV row is written over by the next step. */
static void run_verify(struct shoal_model *m, const struct seqrun *r, enum shoal_dtype kv)
{
    const int64_t V = m->cfg.n_vocab;
    struct shoal_err err = {0};
    struct shoal_ctx *ctx = one_seq_ctx(m, kv);
    float *rows = malloc((size_t)(4 * V) * sizeof(float));
    cr_assert(eq(int, shoal_ctx_eval(ctx, r->prompt, r->n_prompt, rows, 0, &err), 0), "%s",
              err.msg);
    cr_assert(eq(int, memcmp(rows, r->logits, (size_t)V * sizeof(float)), 0));
    for (int s = 0, k; s < N_DEC; s += k - 1) {
        k = N_DEC - s < 4 ? N_DEC - s + 1 : 4;   /* rows: k - 1 right, the last wrong */
        int32_t t[4];
        for (int j = 0; j < k - 1; j++)
            t[j] = r->gen[s + j];
        t[k - 1] = (k - 1 < N_DEC - s ? r->gen[s + k - 1] + 1 : 7) % (int32_t)V;
        cr_assert(eq(int, shoal_ctx_eval(ctx, t, k, rows, 1, &err), 0), "%s", err.msg);
        for (int j = 0; j < k - 1; j++)
            cr_assert(eq(int, memcmp(rows + j * V, r->logits + (s + j + 1) * V,
                                     (size_t)V * sizeof(float)), 0),
                      "verify row %d after token %d", j, s + j);
        shoal_ctx_truncate(ctx, r->n_prompt + s + k - 1);
    }
    free(rows);
    shoal_ctx_free(ctx);
}

/* Where a batched sequence stands. */
struct live {
    int64_t fed;            /* prompt tokens evaluated (prefix copies included) */
    int n_out;              /* logits rows produced */
    int32_t next;           /* the token to feed next, once decoding */
};

/* All N_SEQ sequences through one context of N_SEQ slots, n_batch rows per
 * step: sequence i joins at step start[i]; each step gives every decoding
 * sequence its one token and the prefilling ones chunks of what is left of
 * n_batch, in an order that rotates each step. copy_from[i] >= 0: sequence
 * i first takes n_copy[i] cached tokens of that sequence (once it has
 * them). Checks every logits row against solo[i] bit for bit. */
static void run_batched(struct shoal_model *m, struct seqrun *solo, enum shoal_dtype kv,
                        int64_t n_batch, const int *start, const int *copy_from,
                        const int64_t *n_copy)
{
    const int64_t V = m->cfg.n_vocab;
    struct shoal_err err = {0};
    struct shoal_ctx_params p = shoal_ctx_params_default();
    p.n_ctx = 128;
    p.n_batch = n_batch;
    p.n_seq = N_SEQ;
    p.kv_dtype = kv;
    struct shoal_ctx *ctx = shoal_ctx_create(m, p, &err);
    cr_assert(ctx != NULL, "%s", err.msg);
    float *out = malloc((size_t)(N_SEQ * V) * sizeof(float));
    struct live lv[N_SEQ] = {0};
    int mixed_steps = 0;   /* steps where a decode row met another sequence's prompt chunk */
    for (int step = 0; step < 400; step++) {
        struct shoal_ctx_seg segs[N_SEQ];
        int ns = 0, n_decode = 0, n_prefill = 0;
        int64_t room = n_batch;
        for (int j = 0; j < N_SEQ && room > 0; j++) {
            const int i = (j + step) % N_SEQ;
            struct live *l = &lv[i];
            if (step < start[i] || l->n_out == N_DEC + 1)
                continue;
            if (l->fed == 0 && copy_from[i] >= 0) {
                const struct live *src = &lv[copy_from[i]];
                if (src->fed < n_copy[i])
                    continue;   /* wait until the source holds the prefix */
                shoal_ctx_seq_copy(ctx, i, copy_from[i], n_copy[i]);
                cr_assert(eq(i64, shoal_ctx_seq_n_past(ctx, i), n_copy[i]));
                l->fed = n_copy[i];
            }
            struct shoal_ctx_seg *sg = &segs[ns];
            sg->seq = i;
            sg->all_logits = 0;
            if (l->fed < solo[i].n_prompt) {
                int64_t k = solo[i].n_prompt - l->fed;
                if (k > room)
                    k = room;
                sg->tokens = solo[i].prompt + l->fed;
                sg->n = k;
                sg->logits = l->fed + k == solo[i].n_prompt ? out + ns * V : NULL;
                n_prefill++;
            } else {
                sg->tokens = &l->next;
                sg->n = 1;
                sg->logits = out + ns * V;
                n_decode++;
            }
            room -= sg->n;
            ns++;
        }
        if (ns == 0) {
            int all_done = 1;
            for (int i = 0; i < N_SEQ; i++)
                all_done &= lv[i].n_out == N_DEC + 1;
            if (all_done)
                break;
            continue;
        }
        mixed_steps += n_decode > 0 && n_prefill > 0;
        cr_assert(eq(int, shoal_ctx_eval_segs(ctx, segs, ns, &err), 0), "%s", err.msg);
        for (int k = 0; k < ns; k++) {
            const int i = (int)segs[k].seq;
            struct live *l = &lv[i];
            if (l->fed < solo[i].n_prompt)
                l->fed += segs[k].n;
            if (!segs[k].logits)
                continue;
            cr_assert(eq(int, memcmp(segs[k].logits, solo[i].logits + l->n_out * V,
                                     (size_t)V * sizeof(float)), 0),
                      "sequence %d, logits row %d: bytes differ from the sequence run alone "
                      "(step %d, %d segments)", i, l->n_out, step, ns);
            if (l->n_out < N_DEC) {
                l->next = argmax(segs[k].logits, V);
                cr_assert(eq(i32, l->next, solo[i].gen[l->n_out]));
            }
            l->n_out++;
        }
    }
    for (int i = 0; i < N_SEQ; i++)
        cr_assert(eq(int, lv[i].n_out, N_DEC + 1), "sequence %d did not finish", i);
    cr_assert(gt(int, mixed_steps, 0), "no step mixed decode and prefill rows");
    free(out);
    shoal_ctx_free(ctx);
}

static void check_model(struct shoal_model *m, enum shoal_dtype kv)
{
    const int64_t V = m->cfg.n_vocab;
    struct seqrun r[N_SEQ];
    memset(r, 0, sizeof r);
    make_prompt(&r[0], 29, 0x9e3779b9u, V, NULL, 0);
    make_prompt(&r[1], 1, 0x85ebca6bu, V, NULL, 0);
    make_prompt(&r[2], 13, 0xc2b2ae35u, V, NULL, 0);
    make_prompt(&r[3], 21, 0x27d4eb2fu, V, &r[0], 17);   /* shares 17 tokens with 0 */
    for (int i = 0; i < N_SEQ; i++)
        run_solo(m, &r[i], kv);
    /* the solo runs differ from each other: the comparison can fail */
    cr_assert(ne(int, memcmp(r[0].logits, r[2].logits, (size_t)V * sizeof(float)), 0));

    for (int i = 0; i < N_SEQ; i++)
        run_verify(m, &r[i], kv);

    const int start[N_SEQ] = {0, 0, 3, 5};
    const int none[N_SEQ] = {-1, -1, -1, -1};
    const int64_t zero[N_SEQ] = {0};
    run_batched(m, r, kv, 5, start, none, zero);        /* small steps: many cuts */
    run_batched(m, r, kv, 16, start, none, zero);
    const int copy[N_SEQ] = {-1, -1, -1, 0};
    const int64_t n_copy[N_SEQ] = {0, 0, 0, 17};
    run_batched(m, r, kv, 7, start, copy, n_copy);      /* shared prefix from slot 0 */
    for (int i = 0; i < N_SEQ; i++)
        free(r[i].logits);
}

Test(batching, bundled_model_alone_equals_batched)
{
    struct shoal_err err = {0};
    struct shoal_model *m = shoal_model_load(MODEL_DIR, &err);
    cr_assert(m != NULL, "%s", err.msg);
    check_model(m, SHOAL_DTYPE_F32);
    check_model(m, SHOAL_DTYPE_BF16);
    shoal_model_free(m);
}

Test(batching, int4a8_container_through_the_store)
{
    char tmp[64];
    snprintf(tmp, sizeof tmp, "/tmp/shoal-batching-XXXXXX");
    cr_assert(mkdtemp(tmp) != NULL);
    char dir[128];
    snprintf(dir, sizeof dir, "%s/ct", tmp);
    struct shoal_err err = {0};
    struct shoal_model *src = shoal_model_load(MODEL_DIR, &err);
    cr_assert(src != NULL, "%s", err.msg);
    struct shoal_convert_params p = shoal_convert_params_default();
    p.experts_dtype = SHOAL_DTYPE_INT4A8;
    p.dense_dtype = SHOAL_DTYPE_INT4A8;
    p.group = 32;
    cr_assert(eq(int, shoal_container_convert(src, MODEL_DIR, dir, &p, &err), 0), "%s",
              err.msg);
    shoal_model_free(src);
    /* the manifest lists the side files it copied (docs/FORMAT.md "files") */
    char manifest[160];
    snprintf(manifest, sizeof manifest, "%s/shoal.json", dir);
    json_error_t jerr;
    json_t *man = json_load_file(manifest, 0, &jerr);
    cr_assert(man != NULL, "%s", jerr.text);
    const json_t *files = json_object_get(man, "files");
    const int is_list = json_is_array(files) && json_array_size(files) >= 2;
    cr_assert(is_list, "files is a list of the side files");
    cr_assert(eq(str, (char *)json_string_value(json_array_get(files, 0)), "config.json"));
    json_decref(man);
    struct shoal_model *m = shoal_model_load(dir, &err);
    cr_assert(m != NULL, "%s", err.msg);
    struct shoal_expert_store_params sp = shoal_expert_store_params_default();
    sp.learn = 0;
    m->store = shoal_expert_store_create(m->ct, sp, &err);
    cr_assert(m->store != NULL, "the container's experts come from a store: %s", err.msg);
    check_model(m, SHOAL_DTYPE_F16);
    shoal_expert_store_destroy(m->store);
    shoal_model_free(m);
    cr_assert(eq(int, test_rm_rf(tmp), 0), "rm -rf %s: %s", tmp, strerror(errno));
}

Test(batching, bad_steps_are_refused)
{
    struct shoal_err err = {0};
    struct shoal_model *m = shoal_model_load(MODEL_DIR, &err);
    cr_assert(m != NULL, "%s", err.msg);
    struct shoal_ctx_params p = shoal_ctx_params_default();
    p.n_ctx = 8;
    p.n_batch = 4;
    p.n_seq = 2;
    struct shoal_ctx *ctx = shoal_ctx_create(m, p, &err);
    cr_assert(ctx != NULL, "%s", err.msg);
    const int32_t t[6] = {1, 2, 3, 4, 5, 6};
    struct shoal_ctx_seg s[3] = {{.seq = 0, .tokens = t, .n = 3},
                                 {.seq = 1, .tokens = t, .n = 2},
                                 {.seq = 0, .tokens = t, .n = 1}};
    cr_assert(eq(int, shoal_ctx_eval_segs(ctx, s, 2, &err), SHOAL_EINVAL));   /* 5 > 4 rows */
    cr_assert(strstr(err.msg, "n_batch=4") != NULL, "%s", err.msg);
    s[1].n = 1;
    s[1].seq = 0;
    cr_assert(eq(int, shoal_ctx_eval_segs(ctx, s, 2, &err), SHOAL_EINVAL));   /* seq twice */
    s[1].seq = 2;
    cr_assert(eq(int, shoal_ctx_eval_segs(ctx, s, 2, &err), SHOAL_EINVAL));   /* no seq 2 */
    s[1].seq = 1;
    const int32_t bad = (int32_t)m->cfg.n_vocab;
    s[1].tokens = &bad;
    cr_assert(eq(int, shoal_ctx_eval_segs(ctx, s, 2, &err), SHOAL_ERANGE));
    cr_assert(eq(i64, shoal_ctx_seq_n_past(ctx, 0), 0), "nothing appended");
    s[1].tokens = t;
    cr_assert(eq(int, shoal_ctx_eval_segs(ctx, s, 2, &err), 0), "%s", err.msg);
    cr_assert(eq(i64, shoal_ctx_seq_n_past(ctx, 0), 3));
    cr_assert(eq(i64, shoal_ctx_seq_n_past(ctx, 1), 1));
    s[0].n = 4;
    s[0].seq = 1;
    cr_assert(eq(int, shoal_ctx_eval_segs(ctx, s, 1, &err), 0), "%s", err.msg);
    s[0].n = 4;   /* 5 + 4 > n_ctx 8 */
    cr_assert(eq(int, shoal_ctx_eval_segs(ctx, s, 1, &err), SHOAL_ERANGE));
    cr_assert(eq(i64, shoal_ctx_seq_n_past(ctx, 1), 5));
    shoal_ctx_free(ctx);
    shoal_model_free(m);
}
