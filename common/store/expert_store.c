#include "expert_store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "hot_set.h"
#include "quant.h"
#include "log.h"
#include "pages.h"
#include "placement.h"
#include "util.h"

/* Locking: s->mu guards entries' state, the LRU, the slot table, staging,
 * the counters and the sources' in-flight accounting. The main thread holds
 * it while it looks things up, allocates and submits; io threads take it in
 * on_read() after verifying the bytes. Lock order: s->mu, then the engine's
 * queue lock (submit); the engine never calls back with its lock held.
 * An entry that is LOADING belongs to the io side: nobody frees or moves
 * its blob until on_read() has set READY or FAILED. */

enum entry_state { ENTRY_LOADING, ENTRY_READY, ENTRY_FAILED };
enum entry_tier { TIER_PINNED, TIER_CACHE, TIER_STAGING };

struct entry {
    struct shoal_io_req req[6];     /* the reads in flight (user_data = this entry):
                                     * one blob, or a GGUF expert's components */
    struct shoal_expert_read rd[6]; /* what each reads (container.h) */
    int n_req, pending;             /* reads of this attempt; not completed yet */
    int rd_code;                    /* first failure among them, 0 */
    char *rd_msg;                   /* its message (owned) or NULL */
    struct shoal_expert_store *s;
    void *blob;                     /* [bytes], 4 KiB aligned; staging: the pool's */
    uint64_t bytes;                 /* the buffer's size (shoal_container_blob_bytes) */
    int64_t il, ie;
    enum entry_state state;
    enum entry_tier tier;
    int refs;                       /* > 0 while in the caller's batch */
    int staging_ix;                 /* TIER_STAGING: index in the pool */
    int src;                        /* source of the current read */
    unsigned tried;                 /* bitmask of sources tried */
    int prefetched;                 /* read started by a hint, not used yet */
    int ahead;                      /* TIER_STAGING read ahead of its acquire (in
                                     * s->ahead, held by no batch) */
    int orphan;                     /* read ahead, dropped while LOADING: on_read
                                     * frees it and its staging blob */
    int pf_judged;                  /* prefetched, and counted unused at the step
                                     * its hint was for (not again at eviction) */
    int mapped;                     /* blob is a read-only mapping of the file (the
                                     * page cache's pages, io_engine.h map): munmap
                                     * it, never recycle it or read into it */
    int failed_code;                /* first failure, when FAILED */
    char *failed_msg;               /* its message (owned) or NULL */
    struct entry *prev, *next;      /* recency list (TIER_CACHE), most recent at head */
};

struct source {
    char *dir;              /* container directory (owned) */
    char *path;             /* its experts.bin (owned) */
    int fd;
    int direct;             /* O_DIRECT / F_NOCACHE in effect */
    int inflight;           /* reads submitted and not completed */
    double busy_since;      /* when inflight went 0 -> 1, seconds */
    int warned;             /* read-error warnings logged */
    struct shoal_expert_store_source_stats st;
};

#define WARN_MAX_PER_SOURCE 3

/* Prefetch back-off (shoal_expert_store_hint): the moving average of
 * prefetched experts used weighs each outcome by 1 - PF_DECAY; under
 * PF_BACKOFF only one hint call in PF_PROBE is acted on, and that probe
 * reads at most PF_PROBE_READS of the hinted experts (the first named: a
 * token's top route ranks), enough to keep measuring. A probe that read
 * every hinted expert cost a disk-bound decode its bandwidth: a GGUF
 * Q4_K_M in a quarter-size memory cgroup, precision 34 %, read 33.5 MB a
 * decode token against 19.0 MB without prefetch (10.4 vs 11.9 tok/s).
 * Prefetches are background reads (io_engine.h), stopped when dropped, so
 * a wrong one costs little more than the disk's idle time: half of them
 * used is worth it (the V3-width grid's 4 workers, 60-70 % used: decode
 * 0.56 -> 0.60 tok/s at 0.5 against 0.7; docs/BENCHMARKS.md). */
#define PF_DECAY 0.9
#define PF_BACKOFF 0.5
#define PF_PROBE 32
#define PF_PROBE_READS 1

enum hint_mode { HINT_SKIP = 0, HINT_FULL = 1, HINT_PROBE = 2 };

struct shoal_expert_store {
    const struct shoal_container *ct;        /* borrowed */
    struct shoal_expert_store_params p;      /* pointers in it not kept */
    struct shoal_io_engine *io;              /* owned */
    pthread_mutex_t mu;
    pthread_cond_t cv;                       /* some entry left LOADING */
    int n_source;
    struct source src[SHOAL_EXPERT_STORE_MAX_SOURCES];
    uint64_t seed[SHOAL_EXPERT_STORE_MAX_SOURCES];    /* rendezvous seeds */
    double weight[SHOAL_EXPERT_STORE_MAX_SOURCES];    /* rendezvous weights */
    struct entry **slot;                     /* [n_layer * n_expert] pinned/cache entry or NULL */
    struct entry *head, *tail;               /* TIER_CACHE entries, most recent first */
    uint32_t *freq;                          /* [n_layer * n_expert] SHOAL_CACHE_FREQ:
                                              * demand acquires, halved lazily (freq_of);
                                              * NULL under LRU */
    uint32_t *freq_epoch;                    /* [n_layer * n_expert] the epoch freq[] is at */
    uint32_t epoch;                          /* halvings so far */
    uint64_t freq_ticks;                     /* acquires counted in this epoch */
    uint64_t freq_window;                    /* acquires per epoch */
    void *spare[4];                          /* recycled blob buffers (under mu) */
    uint64_t spare_bytes[4];                 /* their sizes */
    int n_spare;
    struct entry **pinned;                   /* [n_pinned] */
    int64_t n_pinned;
    int queue_depth;                         /* the I/O engine's */
    int n_staging;                           /* staging blobs (2 x queue depth): up to
                                              * queue_depth new ones a batch, up to
                                              * queue_depth read ahead (and orphans) */
    void **staging_blob;                     /* [n_staging], allocated on first use */
    int *staging_busy;                       /* [n_staging] */
    int batch_staged;                        /* staging blobs the held batch took new */
    struct entry **ahead;                    /* [queue_depth] staging entries read ahead:
                                              * the rest of a union over budget, or a
                                              * hint the cache did not admit */
    int n_ahead;
    int n_orphan;                            /* ahead entries dropped, still LOADING */
    struct entry **held;                     /* [n_expert] the caller's batch */
    uint8_t *held_kind;                      /* [n_expert] enum held_kind, for counters */
    int64_t held_n, held_il;
    int held_started;                        /* acquire_start done, wait not yet */
    uint32_t *hint_mark;                     /* [n_layer * n_expert] generation that hinted it */
    uint32_t *hint_gen;                      /* [n_layer] generation of the layer's last hint */
    uint8_t *hint_valid;                     /* [n_layer] the last hint is for the coming step */
    int32_t *hint_read;                      /* [n_layer][n_expert] experts the layer's last
                                              * hint read, first hint_n_read[il] */
    int64_t *hint_n_read;                    /* [n_layer] not judged yet (judge_hint) */
    int64_t *layer_ready;                    /* [n_layer] pinned/cache entries READY */
    int64_t *layer_held;                     /* [n_layer] experts this container holds */
    int64_t last_il;                         /* layer of the last acquire, -1 */
    int64_t first_moe;                       /* first MoE layer (counts tokens), -1 */
    int inflight;                            /* reads in flight, all sources */
    double busy_since;                       /* when inflight went 0 -> 1 */
    struct shoal_hot_set *hot;               /* routing counts, owned, or NULL */
    double pf_worth;                         /* moving average of prefetched experts
                                              * used (1) or evicted unused (0) */
    uint64_t pf_skip;                        /* hint calls seen while backing off */
    int pf_probe_pass;                       /* enum hint_mode wants_hints decided: the
                                              * next hint call is acted on so */
    int *gfd;                                /* [gguf->n_file] a GGUF's files (gfd[0] is
                                              * src[0].fd), or NULL */
    uint64_t *use;                           /* [n_layer][n_expert][N_TIERS] demand acquires */
    struct shoal_expert_store_stats st;
};

/* ------------------------------------------------------------ hashing */

/* Sources are ranked by the same weighted rendezvous score as workers
 * (placement.h), seeded by each source's path. */
static int best_source(uint64_t key, const uint64_t *seeds, const double *weights, int n,
                       unsigned exclude)
{
    return shoal_placement_best(key, seeds, weights, n, exclude);
}

int shoal_expert_store_rendezvous(uint64_t key, const uint64_t *seeds,
                                  const double *weights, int n)
{
    return shoal_placement_best(key, seeds, weights, n, 0);
}

static uint64_t expert_key(int64_t il, int64_t ie)
{
    return shoal_placement_key(il, ie);
}

/* Experts ct's experts.bin holds (ct may be filled by hand: counted, not
 * read from ct->n_held). */
static int64_t count_held(const struct shoal_container *ct)
{
    int64_t n = 0;
    for (int64_t il = 0; il < ct->n_layer; il++)
        for (int64_t ie = 0; ie < ct->n_expert; ie++)
            n += shoal_container_holds(ct, il, ie);
    return n;
}

/* ------------------------------------------------------------ entries */

static void *alloc_blob(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, SHOAL_CONTAINER_ALIGN, n ? n : SHOAL_CONTAINER_ALIGN) != 0)
        return NULL;
    return p;
}

/* Expert buffers (cache, pinned, staging) are mapped from the kernel, not
 * taken from malloc's heap: with glibc, the first freed blob raises the
 * mmap threshold above the blob size, later blobs come from the heap, and
 * an LRU frees them in another order than it allocated them. A GGUF's
 * layers differ in blob size (Q4_K_M: ffn_down in Q6_K on some layers),
 * so the holes rarely fit the next request and the heap grew to ~4x the
 * live blobs (a 64 MB cache: 340 MB of anonymous memory, which a memory
 * cgroup charges like any other). A mapping goes back to the kernel when
 * it is unmapped. The pages are 4 KiB aligned (O_DIRECT), a blob of 2 MiB
 * or more 2 MiB aligned on huge pages where the kernel offers them
 * (pages.h). NULL when out of memory. */
static void *blob_map_at(void *at, uint64_t n)
{
    const size_t len = (size_t)(n ? n : SHOAL_CONTAINER_ALIGN);
    if (!at)
        return shoal_pages_map(len);
    return shoal_pages_remap(at, len) ? NULL : at;
}

static void *blob_map(uint64_t n)
{
    return blob_map_at(NULL, n);
}

static void blob_unmap(void *p, uint64_t n)
{
    shoal_pages_unmap(p, (size_t)(n ? n : SHOAL_CONTAINER_ALIGN));
}

static void note_peak(struct shoal_expert_store *s)
{
    uint64_t b = s->st.pinned_bytes + s->st.cached_bytes + s->st.staging_bytes;
    if (b > s->st.peak_expert_bytes)
        s->st.peak_expert_bytes = b;
}

static void lru_unlink(struct shoal_expert_store *s, struct entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        s->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        s->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(struct shoal_expert_store *s, struct entry *e)
{
    e->prev = NULL;
    e->next = s->head;
    if (s->head)
        s->head->prev = e;
    s->head = e;
    if (!s->tail)
        s->tail = e;
}

/* Blob buffers for cache entries come from a small pool: an eviction is
 * almost always followed by a read into a new entry, and a recycled buffer
 * skips the page faults and zeroing of a fresh one (bench/read_probe.c:
 * 858 -> 2121 MB/s for one O_DIRECT read at a time). At most 4 spare
 * buffers are kept, so the memory bound grows by at most 4 blobs. Caller
 * holds mu. */
static void *blob_get(struct shoal_expert_store *s, uint64_t bytes)
{
    for (int i = s->n_spare - 1; i >= 0; i--) {
        if (s->spare_bytes[i] != bytes)
            continue;   /* a GGUF's layers may differ in size */
        void *b = s->spare[i];
        s->n_spare--;
        s->spare[i] = s->spare[s->n_spare];
        s->spare_bytes[i] = s->spare_bytes[s->n_spare];
        return b;
    }
    return blob_map(bytes);
}

static void blob_put(struct shoal_expert_store *s, void *blob, uint64_t bytes)
{
    const int cap = (int)(sizeof s->spare / sizeof s->spare[0]);
    if (s->n_spare == cap) {   /* the oldest goes */
        blob_unmap(s->spare[0], s->spare_bytes[0]);
        memmove(s->spare, s->spare + 1, (size_t)(cap - 1) * sizeof *s->spare);
        memmove(s->spare_bytes, s->spare_bytes + 1, (size_t)(cap - 1) * sizeof *s->spare_bytes);
        s->n_spare--;
    }
    s->spare[s->n_spare] = blob;
    s->spare_bytes[s->n_spare++] = bytes;
}

static void entry_free(struct entry *e)
{
    if (e->mapped)
        blob_unmap(e->blob, e->bytes);
    else if (e->tier == TIER_CACHE && e->s && e->blob)
        blob_put(e->s, e->blob, e->bytes);
    else if (e->tier != TIER_STAGING)
        blob_unmap(e->blob, e->bytes);
    free(e->failed_msg);
    free(e->rd_msg);
    free(e);
}

/* Remove an idle cache entry (not LOADING, no refs). Caller holds mu. */
static void cache_drop(struct shoal_expert_store *s, struct entry *e, int eviction)
{
    lru_unlink(s, e);
    s->slot[e->il * s->ct->n_expert + e->ie] = NULL;
    s->layer_ready[e->il] -= e->state == ENTRY_READY;
    s->st.cached_bytes -= e->bytes;
    s->st.cached_experts--;
    if (eviction) {
        s->st.evictions++;
        s->st.prefetch_evicted += e->prefetched != 0;
        if (e->prefetched && !e->pf_judged)
            s->pf_worth *= PF_DECAY;
    }
    entry_free(e);
}

/* 1 if e belongs to layer il's current hint (a prefetch must not evict
 * what the same hint just brought in). */
static int in_current_hint(const struct shoal_expert_store *s, const struct entry *e,
                           int64_t hint_il)
{
    return hint_il >= 0 && e->il == hint_il && s->hint_gen[hint_il] != 0 &&
           s->hint_mark[e->il * s->ct->n_expert + e->ie] == s->hint_gen[hint_il];
}

/* ------------------------------------------------------------ policy */

int shoal_cache_policy_parse(const char *text, enum shoal_cache_policy *out)
{
    if (!strcmp(text, "lru"))
        *out = SHOAL_CACHE_LRU;
    else if (!strcmp(text, "freq"))
        *out = SHOAL_CACHE_FREQ;
    else
        return -1;
    return 0;
}

const char *shoal_cache_policy_name(enum shoal_cache_policy p)
{
    return p == SHOAL_CACHE_FREQ ? "freq" : "lru";
}

/* Expert k's (il * n_expert + ie) acquire count, halved once per epoch
 * since it was last counted (lazily: O(1), no sweep). Caller holds mu. */
static uint32_t freq_of(const struct shoal_expert_store *s, int64_t k)
{
    const uint32_t age = s->epoch - s->freq_epoch[k];
    return age >= 32 ? 0 : s->freq[k] >> age;
}

/* One demand acquire of expert k; every freq_window acquires an epoch
 * ends (all counts halve). Caller holds mu. */
static void freq_count(struct shoal_expert_store *s, int64_t k)
{
    const uint32_t f = freq_of(s, k);
    s->freq[k] = f < UINT32_MAX ? f + 1 : f;
    s->freq_epoch[k] = s->epoch;
    if (++s->freq_ticks >= s->freq_window) {
        s->freq_ticks = 0;
        s->epoch++;
    }
}

static int evictable(const struct shoal_expert_store *s, const struct entry *e, int64_t hint_il)
{
    return e->refs == 0 && e->state != ENTRY_LOADING && !in_current_hint(s, e, hint_il);
}

/* SHOAL_CACHE_FREQ: make room for expert cand (its count + 1: the use at
 * hand) by evicting, one at a time, the least acquired of the
 * SHOAL_CACHE_FREQ_SAMPLE least recent idle entries (ties: the less
 * recent), as long as that one was acquired less often than cand. Returns
 * 1 if `need` more bytes fit, 0 if cand is not admitted (counted) or
 * nothing is idle. O(SHOAL_CACHE_FREQ_SAMPLE + entries in use) an
 * eviction. Caller holds mu. */
static int make_room_freq(struct shoal_expert_store *s, uint64_t need, int64_t hint_il,
                          int64_t cand)
{
    const uint64_t budget = s->p.cache_bytes;
    const int64_t NE = s->ct->n_expert;
    const uint64_t fc = (uint64_t)freq_of(s, cand) + 1;
    while (s->st.cached_bytes + need > budget) {
        struct entry *victim = NULL;
        uint32_t fv = 0;
        int seen = 0;
        for (struct entry *e = s->tail; e && seen < SHOAL_CACHE_FREQ_SAMPLE; e = e->prev) {
            if (!evictable(s, e, hint_il))
                continue;
            seen++;
            const uint32_t f = freq_of(s, e->il * NE + e->ie);
            if (!victim || f < fv) {
                victim = e;
                fv = f;
            }
        }
        if (!victim)
            return 0;
        if (fv >= fc) {
            s->st.not_admitted++;
            return 0;
        }
        cache_drop(s, victim, 1);
    }
    return 1;
}

/* Make room for `need` more bytes in the cache budget for expert cand
 * (il * n_expert + ie): LRU evicts least-recently-used idle entries, FREQ
 * asks make_room_freq. Returns 1 if they fit. Caller holds mu. */
static int make_room(struct shoal_expert_store *s, uint64_t need, int64_t hint_il,
                     int64_t cand)
{
    const uint64_t budget = s->p.cache_bytes;
    if (budget == UINT64_MAX)
        return 1;
    if (need > budget)
        return 0;
    if (s->freq)
        return make_room_freq(s, need, hint_il, cand);
    struct entry *e = s->tail;
    while (e && s->st.cached_bytes + need > budget) {
        struct entry *prev = e->prev;
        if (evictable(s, e, hint_il))
            cache_drop(s, e, 1);
        e = prev;
    }
    return s->st.cached_bytes + need <= budget;
}

/* ------------------------------------------------------------ reads */

static void source_start(struct shoal_expert_store *s, int si, double now)
{
    if (s->src[si].inflight++ == 0)
        s->src[si].busy_since = now;
    if (s->inflight++ == 0)
        s->busy_since = now;
}

static void source_done(struct shoal_expert_store *s, int si, double now)
{
    if (--s->src[si].inflight == 0)
        s->src[si].st.busy_seconds += now - s->src[si].busy_since;
    if (--s->inflight == 0)
        s->st.read_busy_seconds += now - s->busy_since;
}

static void entry_fail(struct entry *e, int code, const char *msg)
{
    e->state = ENTRY_FAILED;
    if (!e->failed_msg) {
        e->failed_code = code;
        e->failed_msg = shoal_xstrdup(msg);
    }
}

static void on_read(struct shoal_io_req *req);

/* A step wants e, which a hint is reading in the background: the rest of
 * its reads go ahead of the other prefetches (io_engine.h). Caller holds
 * mu. */
static void demand(struct shoal_expert_store *s, struct entry *e)
{
    if (e->state != ENTRY_LOADING || !e->prefetched)
        return;
    for (int k = 0; k < e->n_req; k++)
        shoal_io_engine_promote(s->io, &e->req[k]);
}

/* Submit e's read from source si. Caller holds mu. On a refused submit the
 * entry is FAILED (the engine is shutting down). */
static void submit_read(struct shoal_expert_store *s, struct entry *e, int si)
{
    const struct shoal_container *ct = s->ct;
    if (e->mapped) {   /* a retry after a mapped read failed its check */
        if (!blob_map_at(e->blob, e->bytes)) {   /* anonymous pages again, in place */
            entry_fail(e, SHOAL_ENOMEM, "cannot remap an expert buffer for a retry");
            return;
        }
        e->mapped = 0;
    }
    /* a blob in a cache or pinned buffer of its own may be mapped from a
     * warm page cache (staging buffers are reused for reads) */
    const int map = e->tier != TIER_STAGING && !s->src[si].direct;
    e->src = si;
    e->tried |= 1u << si;
    e->state = ENTRY_LOADING;
    e->n_req = shoal_container_expert_reads(ct, e->il, e->ie, e->rd);
    e->pending = e->n_req;
    for (int k = 0; k < e->n_req; k++) {
        const struct shoal_expert_read *rd = &e->rd[k];
        e->req[k] = (struct shoal_io_req){.fd = s->gfd ? s->gfd[rd->file] : s->src[si].fd,
                                          .buf = (char *)e->blob + rd->buf_off,
                                          .len = (size_t)rd->len, .off = rd->off,
                                          .min_len = rd->need < rd->len ? rd->need : 0,
                                          /* a demand read goes ahead of prefetches */
                                          .urgent = !e->prefetched, .map = map,
                                          .cb = on_read, .user_data = e};
        double now = shoal_time_s();
        source_start(s, si, now);
        struct shoal_err err = {0};
        if (shoal_io_engine_submit(s->io, &e->req[k], &err)) {
            source_done(s, si, now);
            char msg[2 * SHOAL_ERR_MSG_MAX];
            snprintf(msg, sizeof msg, "cannot read '%s' layer %lld expert %lld: %s",
                     s->src[si].path, (long long)e->il, (long long)e->ie, err.msg);
            /* the parts submitted complete on their own; the entry fails then */
            e->pending -= e->n_req - k;
            if (!e->rd_code) {
                e->rd_code = err.code;
                e->rd_msg = shoal_xstrdup(msg);
            }
            if (e->pending == 0) {
                entry_fail(e, e->rd_code, e->rd_msg);
                free(e->rd_msg);
                e->rd_msg = NULL;
                e->rd_code = 0;
            }
            return;
        }
    }
}

static void start_read(struct shoal_expert_store *s, struct entry *e)
{
    e->tried = 0;
    int si = best_source(expert_key(e->il, e->ie), s->seed, s->weight, s->n_source, 0);
    submit_read(s, e, si);
}

/* A GGUF component's read (rd, into e's buffer): long enough to hold the
 * expert's bytes (the page-rounded tail may run past the end of the
 * file) and every block scale finite. Returns 0 or a status with msg. */
static int verify_part(struct shoal_expert_store *s, struct entry *e,
                       const struct shoal_expert_read *rd, int64_t result, char *msg,
                       size_t cap)
{
    const struct shoal_container *ct = s->ct;
    if (result < 0 || (uint64_t)result < rd->need) {
        const int code = result < 0 ? (int)result : SHOAL_EIO;
        snprintf(msg, cap, "cannot read '%s' layer %lld expert %lld at offset %" PRIu64 ": %s",
                 ct->gguf->files[rd->file], (long long)e->il, (long long)e->ie, rd->off,
                 code == SHOAL_EIO ? "unexpected end of file" : shoal_strerror(code));
        return code;
    }
    struct shoal_err fe = {0};
    const int code = shoal_container_gguf_check(ct, e->il, e->ie, rd, e->blob, &fe);
    if (code)
        snprintf(msg, cap, "'%.200s': %.300s", ct->gguf->files[rd->file], fe.msg);
    return code;
}

/* Completion of one read, on an io thread: verify it; the last of an
 * entry's reads publishes the entry or retries it elsewhere. */
static void on_read(struct shoal_io_req *req)
{
    struct entry *e = req->user_data;
    struct shoal_expert_store *s = e->s;
    const struct shoal_container *ct = s->ct;
    const int si = e->src;
    const uint64_t off = req->off;
    char msg[SHOAL_ERR_MSG_MAX] = "";
    int code = 0;
    if (ct->gguf) {
        const struct shoal_expert_read *rd = &e->rd[req - e->req];
        code = verify_part(s, e, rd, req->result, msg, sizeof msg);
        pthread_mutex_lock(&s->mu);
        e->mapped |= req->mapped;
        if (code && !e->rd_code) {
            e->rd_code = code;
            e->rd_msg = shoal_xstrdup(msg);
        }
        if (!code) {
            s->src[si].st.bytes_read += rd->len;
            s->st.bytes_read += rd->len;
        }
        if (--e->pending > 0) {
            source_done(s, si, shoal_time_s());
            pthread_mutex_unlock(&s->mu);
            return;
        }
        code = e->rd_code;
        snprintf(msg, sizeof msg, "%s", e->rd_msg ? e->rd_msg : "");
        free(e->rd_msg);
        e->rd_msg = NULL;
        e->rd_code = 0;
        pthread_mutex_unlock(&s->mu);
    } else if (req->result == (int64_t)shoal_container_blob_bytes(ct, e->il)) {
        e->mapped = req->mapped;   /* the entry is the io side's until READY / FAILED */
        uint64_t h = XXH64(e->blob, (size_t)shoal_container_blob_bytes(ct, e->il), 0);
        uint64_t want = ct->expert_xxh64[e->il * ct->n_expert + e->ie];
        if (h != want) {
            code = SHOAL_EFORMAT;
            snprintf(msg, sizeof msg, "checksum mismatch: '%s' layer %lld expert %lld at "
                     "offset %" PRIu64 ": xxh64 %016" PRIx64 ", manifest %016" PRIx64,
                     s->src[si].path, (long long)e->il, (long long)e->ie, off, h, want);
        } else if (ct->experts_dtype == SHOAL_DTYPE_FP8 ||
                   ct->experts_dtype == SHOAL_DTYPE_MXFP4 ||
                   shoal_dtype_is_quant(ct->experts_dtype)) {
            /* the bytes are the file's; a file whose writer let a NaN code
             * or a non-finite int8/int4 group scale through (not shoal
             * convert, which never writes one) is refused at the first
             * read of the expert */
            struct shoal_expert_weights v;
            shoal_container_expert_views(ct, e->il, e->blob, &v);
            const struct shoal_weight *w[3] = {&v.w_gate, &v.w_up, &v.w_down};
            struct shoal_err fe = {0};
            for (int c = 0; c < 3 && !code; c++) {
                const char *cn = c == 0 ? "w_gate" : c == 1 ? "w_up" : "w_down";
                code = ct->experts_dtype == SHOAL_DTYPE_FP8     ? shoal_fp8_check(w[c], 1, cn, &fe)
                       : ct->experts_dtype == SHOAL_DTYPE_MXFP4 ? shoal_mxfp4_check(w[c], cn, &fe)
                                                                : shoal_weight_check_scales(w[c], cn, &fe);
            }
            if (code)
                snprintf(msg, sizeof msg, "'%.200s' layer %lld expert %lld: %.250s",
                         s->src[si].path, (long long)e->il, (long long)e->ie, fe.msg);
        } else if (ct->experts_dtype == SHOAL_DTYPE_GGML) {
            /* a converted GGUF's ggml blocks: every scale finite (as a GGUF's) */
            struct shoal_err fe = {0};
            code = shoal_container_ggml_check(ct, e->il, e->ie, e->blob, &fe);
            if (code)
                snprintf(msg, sizeof msg, "%.400s", fe.msg);
        }
    } else {
        code = req->result < 0 ? (int)req->result : SHOAL_EIO;
        snprintf(msg, sizeof msg, "cannot read '%s' layer %lld expert %lld at offset %"
                 PRIu64 ": %s", s->src[si].path, (long long)e->il, (long long)e->ie, off,
                 code == SHOAL_EIO ? "unexpected end of file" : shoal_strerror(code));
    }
    const double now = shoal_time_s();
    int warn = 0, next = -1;
    pthread_mutex_lock(&s->mu);
    source_done(s, si, now);
    struct source *src = &s->src[si];
    if (!code) {
        src->st.reads++;
        if (!ct->gguf) {
            src->st.bytes_read += shoal_container_blob_bytes(ct, e->il);
            s->st.bytes_read += shoal_container_blob_bytes(ct, e->il);
        }
        s->st.mapped_reads += (uint64_t)e->mapped;
        e->state = ENTRY_READY;
        if (e->tier != TIER_STAGING)
            s->layer_ready[e->il]++;
    } else {
        src->st.errors += code != SHOAL_ECANCELED;
        s->st.reads_cancelled += code == SHOAL_ECANCELED && e->orphan;
        entry_fail(e, code, msg);
        if (code != SHOAL_ECANCELED && !e->orphan)
            next = best_source(expert_key(e->il, e->ie), s->seed, s->weight, s->n_source,
                               e->tried);
        if (next >= 0) {
            if (src->warned < WARN_MAX_PER_SOURCE)
                warn = ++src->warned;
            s->st.source_fallbacks++;
            submit_read(s, e, next);   /* LOADING again, or FAILED if refused */
        }
    }
    if (e->state != ENTRY_LOADING)
        pthread_cond_broadcast(&s->cv);
    if (e->orphan && e->state != ENTRY_LOADING) {   /* nobody wants it any more */
        s->staging_busy[e->staging_ix] = 0;
        s->n_orphan--;
        entry_free(e);
    }
    pthread_mutex_unlock(&s->mu);
    /* e may be gone now; msg and the paths are not */
    if (warn)
        shoal_log(SHOAL_LOG_WARN, "expert_store", "%s; reading it from '%s' instead%s", msg,
                  s->src[next].path, warn == WARN_MAX_PER_SOURCE ?
                  " (further errors on this source are counted, not logged)" : "");
}

/* ------------------------------------------------------------ sources */

/* Open path for reading, O_DIRECT/F_NOCACHE when asked and the file system
 * allows an aligned read through it; else buffered, with one warning. */
static int open_source(struct source *src, int direct, struct shoal_err *err)
{
    src->fd = -1;
#ifdef O_DIRECT
    if (direct) {
        int fd = open(src->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        void *probe = fd >= 0 ? alloc_blob(SHOAL_CONTAINER_ALIGN) : NULL;
        ssize_t got = probe ? pread(fd, probe, SHOAL_CONTAINER_ALIGN, 0) : -1;
        const int e = probe ? errno : fd < 0 ? errno : ENOMEM;
        free(probe);
        if (got == SHOAL_CONTAINER_ALIGN) {
            src->fd = fd;
            src->direct = 1;
        } else {
            if (fd >= 0)
                close(fd);
            shoal_log(SHOAL_LOG_WARN, "expert_store",
                      "O_DIRECT not available for '%s' (%s); using buffered reads",
                      src->path, got < 0 ? strerror(e) : "short read");
        }
    }
#endif
    if (src->fd < 0)
        src->fd = open(src->path, O_RDONLY | O_CLOEXEC);
    if (src->fd < 0) {
        int e = errno;
        return shoal_err_set(err, -e, "cannot open '%s': %s", src->path, strerror(e));
    }
#if defined(F_NOCACHE)
    if (direct && !src->direct && fcntl(src->fd, F_NOCACHE, 1) == 0)
        src->direct = 1;
#endif
    return 0;
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* A mirror must hold exactly the experts ct holds: a mirror of a shard is
 * a copy of the same shard. A mirror with a manifest is opened (and so
 * validated) and its held set compared; one without (a bare experts.bin
 * copy) can only mirror a full container, whose size check_mirror
 * compares (only a full set of blobs has that size). */
static int check_mirror_held(const struct shoal_expert_store *s, const struct source *m,
                             struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    if (!shoal_container_is(m->dir)) {
        if (!ct->held)
            return 0;
        return shoal_err_set(err, SHOAL_EFORMAT, "mirror '%s' has no shoal.json, but '%s' "
                             "is a shard: a shard's mirror must be a copy of the same shard",
                             m->dir, ct->dir);
    }
    struct shoal_model_config cfg;
    struct shoal_err oerr = {0};
    struct shoal_container *mc = shoal_container_open(m->dir, &cfg, &oerr);
    if (!mc)
        return shoal_err_set(err, oerr.code, "mirror '%s': %s", m->dir, oerr.msg);
    int rc = 0;
    if (mc->fingerprint != ct->fingerprint || mc->n_layer != ct->n_layer ||
        mc->n_expert != ct->n_expert) {
        rc = shoal_err_set(err, SHOAL_EFORMAT, "mirror '%s' holds another model: fingerprint "
                           "%016" PRIx64 ", expected %016" PRIx64 " (the fingerprint of '%s')",
                           m->dir, mc->fingerprint, ct->fingerprint, ct->dir);
    }
    for (int64_t il = 0; il < ct->n_layer && !rc; il++) {
        for (int64_t ie = 0; ie < ct->n_expert && !rc; ie++) {
            int a = shoal_container_holds(ct, il, ie), b = shoal_container_holds(mc, il, ie);
            if (a != b)
                rc = shoal_err_set(err, SHOAL_EFORMAT, "mirror '%s' holds another set of "
                                   "experts than '%s': layer %lld expert %lld is held by "
                                   "'%s' only (the mirror holds %lld of %lld, '%s' %lld); a "
                                   "mirror must be a copy of the same container or shard",
                                   m->dir, ct->dir, (long long)il, (long long)ie,
                                   a ? ct->dir : m->dir, (long long)mc->n_held,
                                   (long long)mc->n_moe_expert, ct->dir,
                                   (long long)count_held(ct));
        }
    }
    shoal_container_close(mc);
    return rc;
}

/* A mirror's experts.bin must be the primary's bytes: same header, size
 * and fingerprint (docs/FORMAT.md), and for a shard the same held set. */
static int check_mirror(const struct shoal_expert_store *s, const struct source *m,
                        struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    unsigned char h[64];
    struct stat sb;
    if (fstat(m->fd, &sb) != 0)
        return shoal_err_set(err, -errno, "mirror '%s': fstat: %s", m->path, strerror(errno));
    ssize_t got = pread(m->fd, h, sizeof h, 0);
    if (got < 0 && m->direct) {
        /* O_DIRECT wants an aligned buffer and length */
        void *b = alloc_blob(SHOAL_CONTAINER_ALIGN);
        got = b ? pread(m->fd, b, SHOAL_CONTAINER_ALIGN, 0) : -1;
        if (got >= (ssize_t)sizeof h)
            memcpy(h, b, sizeof h);
        free(b);
    }
    if (got < (ssize_t)sizeof h || memcmp(h, "SHOALEXP", 8) != 0)
        return shoal_err_set(err, SHOAL_EFORMAT, "mirror '%s' is not a shoal experts file "
                             "(bad or missing header)", m->path);
    uint64_t fp = get_le(h + 24, 8), bytes = get_le(h + 16, 8);
    if (fp != ct->fingerprint)
        return shoal_err_set(err, SHOAL_EFORMAT, "mirror '%s' holds another model: fingerprint "
                             "%016" PRIx64 ", expected %016" PRIx64 " (the fingerprint of '%s')",
                             m->dir, fp, ct->fingerprint, ct->dir);
    int rc = check_mirror_held(s, m, err);
    if (rc)
        return rc;
    if (get_le(h + 8, 4) != SHOAL_CONTAINER_VERSION || bytes != ct->experts_size ||
        (uint64_t)sb.st_size != ct->experts_size)
        return shoal_err_set(err, SHOAL_EFORMAT, "mirror '%s' is %" PRIu64 " bytes (header "
                             "says %" PRIu64 "); expected %" PRIu64 " like '%s' (truncated "
                             "or damaged copy?)", m->path, (uint64_t)sb.st_size, bytes,
                             ct->experts_size, ct->experts_path);
    return 0;
}

static uint64_t path_seed(const char *dir)
{
    char buf[PATH_MAX];
    const char *p = realpath(dir, buf) ? buf : dir;
    return XXH64(p, strlen(p), 0x5eed);
}

static int add_source(struct shoal_expert_store *s, const char *dir, const char *path,
                      struct shoal_err *err)
{
    struct source *src = &s->src[s->n_source];
    memset(src, 0, sizeof *src);
    src->dir = shoal_xstrdup(dir);
    src->path = shoal_xstrdup(path);
    int rc = open_source(src, s->p.direct, err);
    if (rc) {
        free(src->dir);
        free(src->path);
        return rc;
    }
    src->st.path = src->path;
    src->st.direct = src->direct;
    s->seed[s->n_source] = path_seed(dir);
    s->n_source++;
    return 0;
}

static void close_source(struct source *src)
{
    if (src->fd >= 0)
        close(src->fd);
    free(src->dir);
    free(src->path);
}

/* A GGUF set's files, each opened like the source (O_DIRECT when asked
 * and allowed); the first is the source itself. */
static int open_gguf_files(struct shoal_expert_store *s, struct shoal_err *err)
{
    const struct shoal_container_gguf *g = s->ct->gguf;
    if (!g)
        return 0;
    s->gfd = shoal_xcalloc(g->n_file, sizeof *s->gfd);
    s->gfd[0] = s->src[0].fd;
    for (uint32_t i = 1; i < g->n_file; i++)
        s->gfd[i] = -1;
    for (uint32_t i = 1; i < g->n_file; i++) {
        struct source f = {.path = g->files[i]};
        int rc = open_source(&f, s->p.direct, err);
        if (rc)
            return rc;
        s->gfd[i] = f.fd;
    }
    return 0;
}

static int same_file(int a, int b)
{
    struct stat x, y;
    return fstat(a, &x) == 0 && fstat(b, &y) == 0 && x.st_dev == y.st_dev &&
           x.st_ino == y.st_ino;
}

static int open_mirrors(struct shoal_expert_store *s, struct shoal_err *err)
{
    for (int i = 0; i < s->p.n_mirror; i++) {
        const char *dir = s->p.mirrors[i];
        char *path = shoal_path_join(dir, "experts.bin");
        if (!shoal_exists(path)) {   /* e.g. a drive that is not mounted */
            shoal_log(SHOAL_LOG_WARN, "expert_store", "mirror '%s' is missing (no %s); "
                      "ignoring it", dir, path);
            free(path);
            continue;
        }
        int rc = add_source(s, dir, path, err);
        free(path);
        if (rc)
            return rc;
        struct source *m = &s->src[s->n_source - 1];
        if ((rc = check_mirror(s, m, err)))
            return rc;
        int dup = -1;
        for (int j = 0; j < s->n_source - 1 && dup < 0; j++)
            if (same_file(m->fd, s->src[j].fd))
                dup = j;
        if (dup >= 0) {
            shoal_log(SHOAL_LOG_WARN, "expert_store", "mirror '%s' is the same file as "
                      "'%s'; ignoring it", m->path, s->src[dup].path);
            close_source(m);
            s->n_source--;
            continue;
        }
        /* the weight given for this mirror, in --mirror order */
        if (s->p.source_weights)
            s->weight[s->n_source - 1] = s->p.source_weights[1 + i];
    }
    return 0;
}

/* Read a few blobs spread over the file, O_DIRECT when the file system
 * allows it (the page cache would measure RAM), and return MB/s, or a
 * negative status. */
static double probe_source(const struct shoal_expert_store *s, const struct source *src)
{
    const struct shoal_container *ct = s->ct;
    const int64_t total = count_held(ct);
    if (total == 0)
        return 1.0;
    int64_t n = (int64_t)((16u << 20) / ct->blob_bytes);
    n = n < 1 ? 1 : n > 8 ? 8 : n;
    n = n > total ? total : n;
    int fd = -1;
#ifdef O_DIRECT
    fd = open(src->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
#endif
    int own = fd >= 0;
    if (!own)
        fd = src->fd;
    void *buf = alloc_blob((size_t)ct->blob_bytes);
    double rate = buf ? 0 : SHOAL_ENOMEM;
    double t0 = shoal_time_s();
    uint64_t read_bytes = 0;
    for (int64_t k = 0; buf && k < n; k++) {
        /* the x-th held expert, in file order */
        int64_t x = k * total / n, seen = 0;
        uint64_t off = 0, blob = ct->blob_bytes;
        for (int64_t i = 0; i < ct->n_layer * ct->n_expert; i++) {
            if (!shoal_container_holds(ct, i / ct->n_expert, i % ct->n_expert))
                continue;
            if (seen++ == x) {
                off = shoal_container_expert_offset(ct, i / ct->n_expert, i % ct->n_expert);
                blob = shoal_container_blob_bytes(ct, i / ct->n_expert);   /* its layer's */
                break;
            }
        }
        read_bytes += blob;
        size_t done = 0;
        while (done < blob) {
            ssize_t r = pread(fd, (char *)buf + done, (size_t)blob - done,
                              (off_t)(off + done));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                if (own) {   /* O_DIRECT refused mid-way: measure buffered */
                    close(fd);
                    fd = src->fd;
                    own = 0;
                    continue;
                }
                rate = r < 0 ? -errno : SHOAL_EIO;
                break;
            }
            done += (size_t)r;
        }
        if (rate < 0)
            break;
    }
    double dt = shoal_time_s() - t0;
    if (rate == 0)
        rate = (double)read_bytes / 1e6 / (dt > 1e-6 ? dt : 1e-6);
    free(buf);
    if (own)
        close(fd);
    return rate;
}

static void measure_weights(struct shoal_expert_store *s)
{
    for (int i = 0; i < s->n_source; i++) {
        double r = probe_source(s, &s->src[i]);
        if (r <= 0) {
            shoal_log(SHOAL_LOG_WARN, "expert_store", "read probe of '%s' failed (%s); giving "
                      "it the smallest weight", s->src[i].path, shoal_strerror((int)r));
            r = 0;
        }
        s->weight[i] = r;
    }
    double lo = 0;
    for (int i = 0; i < s->n_source; i++)
        if (s->weight[i] > 0 && (lo == 0 || s->weight[i] < lo))
            lo = s->weight[i];
    for (int i = 0; i < s->n_source; i++) {
        if (s->weight[i] <= 0)
            s->weight[i] = lo > 0 ? lo / 100 : 1;
        shoal_log(SHOAL_LOG_INFO, "expert_store", "source '%s' weight=%.1f (probe MB/s)",
                  s->src[i].path, s->weight[i]);
    }
}

/* ------------------------------------------------------------ create */

/* Wait until every entry of es[0..n) has left LOADING. Caller holds mu. */
static void wait_loaded(struct shoal_expert_store *s, struct entry **es, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        while (es[i]->state == ENTRY_LOADING)
            pthread_cond_wait(&s->cv, &s->mu);
}

static int load_pinned(struct shoal_expert_store *s, struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    const int64_t total = ct->n_layer * ct->n_expert;
    const int64_t n_held = count_held(ct);
    if (n_held <= 0)
        return 0;
    int64_t *order = shoal_xmalloc((size_t)total * sizeof *order);
    shoal_hot_set_rank(s->hot, order);
    s->pinned = shoal_xcalloc((size_t)n_held, sizeof *s->pinned);
    double t0 = shoal_time_s();
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    /* the hottest held experts while they fit the budget (a GGUF's layers
     * may differ in size: the first that does not fit ends it) */
    for (int64_t i = 0; i < total; i++) {
        const int64_t il = order[i] / ct->n_expert, ie = order[i] % ct->n_expert;
        if (!shoal_container_holds(ct, il, ie))
            continue;   /* a dense layer, or not in this shard */
        const uint64_t bytes = shoal_container_blob_bytes(ct, il);
        if (s->st.pinned_bytes + bytes > s->p.pin_bytes)
            break;
        void *blob = blob_map(bytes);
        if (!blob) {
            rc = shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate %" PRIu64 " bytes for "
                               "pinned expert %lld (--pin %" PRIu64 " bytes)", bytes,
                               (long long)s->n_pinned + 1, s->p.pin_bytes);
            break;
        }
        struct entry *e = shoal_xcalloc(1, sizeof *e);
        e->s = s;
        e->blob = blob;
        e->bytes = bytes;
        e->il = il;
        e->ie = ie;
        e->tier = TIER_PINNED;
        s->pinned[s->n_pinned++] = e;
        s->slot[order[i]] = e;
        s->st.pinned_bytes += bytes;
        s->st.pinned_experts++;
        start_read(s, e);
    }
    note_peak(s);
    wait_loaded(s, s->pinned, s->n_pinned);
    for (int64_t i = 0; i < s->n_pinned && !rc; i++)
        if (s->pinned[i]->state == ENTRY_FAILED)
            rc = shoal_err_set(err, s->pinned[i]->failed_code, "%s (reading the pinned "
                               "hot-set)", s->pinned[i]->failed_msg);
    pthread_mutex_unlock(&s->mu);
    free(order);
    if (!rc)
        shoal_log(SHOAL_LOG_INFO, "expert_store", "pinned %lld experts (%.1f MB) in %.2f s",
                  (long long)s->n_pinned, (double)s->st.pinned_bytes / 1e6,
                  shoal_time_s() - t0);
    return rc;
}

struct shoal_expert_store *shoal_expert_store_create(const struct shoal_container *ct,
                                                     struct shoal_expert_store_params p,
                                                     struct shoal_err *err)
{
    if (p.n_mirror < 0 || p.n_mirror >= SHOAL_EXPERT_STORE_MAX_SOURCES ||
        (p.n_mirror > 0 && !p.mirrors)) {
        shoal_err_set(err, SHOAL_EINVAL, "%d mirrors given; at most %d", p.n_mirror,
                      SHOAL_EXPERT_STORE_MAX_SOURCES - 1);
        return NULL;
    }
    if (p.source_weights && p.n_source_weights != 1 + p.n_mirror) {
        shoal_err_set(err, SHOAL_EINVAL, "%d source weights given for %d sources (the "
                      "container first, then each mirror)", p.n_source_weights,
                      1 + p.n_mirror);
        return NULL;
    }
    for (int i = 0; p.source_weights && i < p.n_source_weights; i++) {
        if (!(p.source_weights[i] > 0) || !isfinite(p.source_weights[i])) {
            shoal_err_set(err, SHOAL_EINVAL, "source weight %d is %g; weights must be "
                          "positive", i + 1, p.source_weights[i]);
            return NULL;
        }
    }
    if (p.cache_policy != SHOAL_CACHE_LRU && p.cache_policy != SHOAL_CACHE_FREQ) {
        shoal_err_set(err, SHOAL_EINVAL, "cache policy %d (expected lru or freq)",
                      (int)p.cache_policy);
        return NULL;
    }
    struct shoal_expert_store *s = shoal_xcalloc(1, sizeof *s);
    s->ct = ct;
    s->p = p;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->last_il = s->first_moe = -1;
    s->pf_worth = 1.0;
    const int64_t total = ct->n_layer * ct->n_expert;
    s->slot = shoal_xcalloc((size_t)total + 1, sizeof *s->slot);
    s->held = shoal_xcalloc((size_t)ct->n_expert + 1, sizeof *s->held);
    s->held_kind = shoal_xcalloc((size_t)ct->n_expert + 1, sizeof *s->held_kind);
    s->hint_mark = shoal_xcalloc((size_t)total + 1, sizeof *s->hint_mark);
    s->use = shoal_xcalloc((size_t)total * SHOAL_EXPERT_N_TIERS + 1, sizeof *s->use);
    s->hint_gen = shoal_xcalloc((size_t)ct->n_layer + 1, sizeof *s->hint_gen);
    s->hint_valid = shoal_xcalloc((size_t)ct->n_layer + 1, sizeof *s->hint_valid);
    s->hint_read = shoal_xcalloc((size_t)total + 1, sizeof *s->hint_read);
    s->hint_n_read = shoal_xcalloc((size_t)ct->n_layer + 1, sizeof *s->hint_n_read);
    s->layer_ready = shoal_xcalloc((size_t)ct->n_layer + 1, sizeof *s->layer_ready);
    s->layer_held = shoal_xcalloc((size_t)ct->n_layer + 1, sizeof *s->layer_held);
    if (p.cache_policy == SHOAL_CACHE_FREQ) {
        s->freq = shoal_xcalloc((size_t)total + 1, sizeof *s->freq);
        s->freq_epoch = shoal_xcalloc((size_t)total + 1, sizeof *s->freq_epoch);
        /* capacity in experts of the largest blob, at least one */
        const uint64_t cap = p.cache_bytes / (ct->blob_bytes ? ct->blob_bytes : 1);
        s->freq_window = (cap > 0 ? cap : 1) * SHOAL_CACHE_FREQ_WINDOW;
        if (p.cache_bytes == UINT64_MAX)
            s->freq_window = UINT64_MAX;   /* nothing is evicted: counts unused */
    }
    for (int64_t il = 0; il < ct->n_layer; il++)
        for (int64_t ie = 0; ie < ct->n_expert; ie++)
            s->layer_held[il] += shoal_container_holds(ct, il, ie);
    for (int64_t il = 0; il < ct->n_layer && s->first_moe < 0; il++)
        if (ct->layer_offset[il] != UINT64_MAX)
            s->first_moe = il;

    if (ct->gguf && p.n_mirror > 0) {
        shoal_err_set(err, SHOAL_EUNSUPPORTED, "--mirror: '%s' is a GGUF file, whose experts "
                      "are read from the file itself; mirrors are copies of a shoal "
                      "container's experts.bin (shoal convert)", ct->dir);
        goto fail;
    }
    if (add_source(s, ct->dir, ct->experts_path, err) || open_gguf_files(s, err))
        goto fail;
    if (p.source_weights)
        s->weight[0] = p.source_weights[0];
    if (open_mirrors(s, err))
        goto fail;
    if (s->n_source > 1 && !p.source_weights)
        measure_weights(s);
    else if (!p.source_weights)
        s->weight[0] = 1.0;
    for (int i = 0; i < s->n_source; i++)
        s->src[i].st.weight = s->weight[i];

    s->io = shoal_io_engine_create(p.io, err);
    if (!s->io)
        goto fail;
    s->queue_depth = shoal_io_engine_queue_depth(s->io);
    s->n_staging = 2 * s->queue_depth;
    s->staging_blob = shoal_xcalloc((size_t)s->n_staging, sizeof *s->staging_blob);
    s->staging_busy = shoal_xcalloc((size_t)s->n_staging, sizeof *s->staging_busy);
    s->ahead = shoal_xcalloc((size_t)s->queue_depth, sizeof *s->ahead);

    if (p.learn || p.pin_bytes >= ct->blob_bytes) {
        int in_ct = 0;
        /* a GGUF's directory may hold other models: its counts go to the cache */
        char *path = shoal_hot_set_path(ct->gguf ? NULL : ct->dir, p.counts_fallback_dir,
                                        ct->fingerprint, &in_ct);
        s->hot = shoal_hot_set_open(path, ct->fingerprint, ct->n_layer, ct->n_expert,
                                    SHOAL_HOT_SET_DECAY);
        if (!path)
            shoal_log(SHOAL_LOG_INFO, "expert_store", "'%s' is not writable and there is no "
                      "cache directory: routing counts are not kept", ct->dir);
        free(path);
    }
    if (p.pin_bytes >= ct->blob_bytes && load_pinned(s, err))
        goto fail;
    s->p.mirrors = NULL;   /* borrowed for create only */
    s->p.source_weights = NULL;
    s->p.counts_fallback_dir = NULL;
    shoal_log(SHOAL_LOG_INFO, "expert_store", "io=%s queue_depth=%d sources=%d direct=%s "
              "prefetch=%s cache_policy=%s counts=%s", shoal_io_engine_name(s->io),
              s->queue_depth, s->n_source, s->src[0].direct ? "on" : "off",
              p.prefetch ? "on" : "off", shoal_cache_policy_name(p.cache_policy),
              s->hot && shoal_hot_set_file(s->hot) ? shoal_hot_set_file(s->hot) : "none");
    return s;
fail:
    if (s->hot) {   /* nothing was learnt: do not rewrite the file */
        shoal_hot_set_destroy(s->hot);
        s->hot = NULL;
    }
    shoal_expert_store_destroy(s);
    return NULL;
}

void shoal_expert_store_destroy(struct shoal_expert_store *s)
{
    if (!s)
        return;
    /* callbacks of reads still queued run now (cancelled) and touch entries */
    shoal_io_engine_destroy(s->io);
    if (s->hot && s->p.learn && shoal_hot_set_run_total(s->hot) > 0) {
        struct shoal_err err = {0};
        if (shoal_hot_set_save(s->hot, &err))
            shoal_log(SHOAL_LOG_WARN, "expert_store", "routing counts not saved: %s", err.msg);
    }
    shoal_hot_set_destroy(s->hot);
    while (s->head) {
        struct entry *e = s->head;
        s->head = e->next;
        entry_free(e);
    }
    for (int64_t i = 0; i < s->n_pinned; i++)
        entry_free(s->pinned[i]);
    for (int64_t i = 0; i < s->held_n; i++)
        if (s->held[i] && s->held[i]->tier == TIER_STAGING)
            entry_free(s->held[i]);
    for (int i = 0; i < s->n_ahead; i++)   /* orphans went in their callbacks */
        entry_free(s->ahead[i]);
    free(s->ahead);
    free(s->pinned);
    for (int i = 0; i < s->n_spare; i++)
        blob_unmap(s->spare[i], s->spare_bytes[i]);
    for (int i = 0; i < s->n_staging; i++)
        blob_unmap(s->staging_blob[i], s->ct->blob_bytes);
    free(s->staging_blob);
    free(s->staging_busy);
    for (uint32_t i = 1; s->gfd && i < s->ct->gguf->n_file; i++)
        if (s->gfd[i] >= 0)
            close(s->gfd[i]);
    free(s->gfd);
    for (int i = 0; i < s->n_source; i++)
        close_source(&s->src[i]);
    free(s->slot);
    free(s->layer_ready);
    free(s->layer_held);
    free(s->held);
    free(s->held_kind);
    free(s->hint_mark);
    free(s->hint_gen);
    free(s->hint_valid);
    free(s->hint_read);
    free(s->hint_n_read);
    free(s->use);
    free(s->freq);
    free(s->freq_epoch);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ------------------------------------------------------------ acquire */

/* A new staging entry for (il, ie) in a free staging blob, or NULL (*rc =
 * 0 when none is free, else set when memory runs out). Caller holds mu. */
static struct entry *stage_entry(struct shoal_expert_store *s, int64_t il, int64_t ie, int *rc,
                                 struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    *rc = 0;
    for (int k = 0; k < s->n_staging; k++) {
        if (s->staging_busy[k])
            continue;
        if (!s->staging_blob[k]) {
            if (!(s->staging_blob[k] = blob_map(ct->blob_bytes))) {
                *rc = shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate %" PRIu64 " bytes "
                                    "for a staging blob", ct->blob_bytes);
                return NULL;
            }
            s->st.staging_bytes += ct->blob_bytes;
            note_peak(s);
        }
        s->staging_busy[k] = 1;
        struct entry *e = shoal_xcalloc(1, sizeof *e);
        *e = (struct entry){.s = s, .blob = s->staging_blob[k], .bytes = ct->blob_bytes,
                            .il = il, .ie = ie, .tier = TIER_STAGING, .staging_ix = k};
        return e;
    }
    return NULL;
}

/* ------------------------------------------------------------ read-ahead
 *
 * Reads into staging that start before their acquire, so that the disk
 * works while the caller computes: the rest of a union the cache and the
 * batch's staging could not take (acquire_start), and hinted experts the
 * cache did not admit (hint). At most queue_depth of them, dropped ones
 * still loading (orphans) included, so a batch always finds staging blobs.
 * An acquire of their layer takes them; one that does not name them, or
 * an acquire of another layer than theirs or the one before, drops them. */

static int ahead_find(const struct shoal_expert_store *s, int64_t il, int64_t ie)
{
    for (int k = 0; k < s->n_ahead; k++)
        if (s->ahead[k]->il == il && s->ahead[k]->ie == ie)
            return k;
    return -1;
}

static struct entry *ahead_take(struct shoal_expert_store *s, int k)
{
    struct entry *e = s->ahead[k];
    s->ahead[k] = s->ahead[--s->n_ahead];
    e->ahead = 0;
    return e;
}

/* Drop read-ahead k: a hinted one counts as an unused prefetch; one still
 * loading becomes an orphan (on_read frees it). Caller holds mu. */
static void ahead_drop(struct shoal_expert_store *s, int k)
{
    struct entry *e = ahead_take(s, k);
    if (e->prefetched) {
        s->st.prefetch_evicted++;
        s->pf_worth *= PF_DECAY;
    }
    if (e->state == ENTRY_LOADING) {
        /* what is not read yet stays unread: a prefetch between pieces, or
         * queued; on_read frees the orphan when its reads come back */
        for (int r = 0; r < e->n_req; r++)
            shoal_io_engine_cancel(s->io, &e->req[r]);
        e->orphan = 1;
        s->n_orphan++;
        return;
    }
    s->staging_busy[e->staging_ix] = 0;
    entry_free(e);
}

/* Start reading (il, ie) ahead into staging, if there is room. Returns 1
 * if a read started. Caller holds mu. */
static int ahead_start(struct shoal_expert_store *s, int64_t il, int64_t ie, int prefetched)
{
    if (s->n_ahead + s->n_orphan >= s->queue_depth || ahead_find(s, il, ie) >= 0)
        return 0;
    int rc;
    struct entry *e = stage_entry(s, il, ie, &rc, NULL);
    if (!e)
        return 0;
    e->ahead = 1;
    e->prefetched = prefetched;
    s->ahead[s->n_ahead++] = e;
    start_read(s, e);
    return 1;
}

/* A new entry for (il, ie) with a buffer: in the cache when the budget
 * allows, else a free staging blob, else NULL (*rc = 0), or NULL with *rc
 * set when memory runs out. Caller holds mu. */
static struct entry *new_entry(struct shoal_expert_store *s, int64_t il, int64_t ie,
                               int *rc, struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    const uint64_t bytes = shoal_container_blob_bytes(ct, il);
    *rc = 0;
    if (make_room(s, bytes, -1, il * ct->n_expert + ie)) {
        void *blob = blob_get(s, bytes);
        if (!blob) {
            *rc = shoal_err_set(err, SHOAL_ENOMEM, "cannot allocate %" PRIu64 " bytes for "
                                "expert %lld of layer %lld", bytes, (long long)ie,
                                (long long)il);
            return NULL;
        }
        struct entry *e = shoal_xcalloc(1, sizeof *e);
        *e = (struct entry){.s = s, .blob = blob, .bytes = bytes, .il = il, .ie = ie,
                            .tier = TIER_CACHE};
        lru_push_front(s, e);
        s->slot[il * ct->n_expert + ie] = e;
        s->st.cached_bytes += bytes;
        s->st.cached_experts++;
        note_peak(s);
        return e;
    }
    if (s->batch_staged >= s->queue_depth)
        return NULL;
    struct entry *e = stage_entry(s, il, ie, rc, err);
    if (e) {
        s->batch_staged++;
        s->st.staged_reads++;
    }
    return e;
}

/* Drop the caller's hold on e (mu held). Staging entries go back to the
 * pool; failed cache entries leave the cache. */
static void unhold(struct shoal_expert_store *s, struct entry *e)
{
    if (e->tier == TIER_PINNED)
        return;
    e->refs--;
    if (e->tier == TIER_STAGING) {
        s->staging_busy[e->staging_ix] = 0;
        entry_free(e);
    } else if (e->refs == 0 && e->state == ENTRY_FAILED) {
        cache_drop(s, e, 0);
    }
}

enum held_kind { HELD_PINNED, HELD_CACHED, HELD_INFLIGHT, HELD_DISK, HELD_AHEAD };

/* The step layer il's last hint was for has come (its whole batch is held):
 * each expert that hint read and this step does not use counts against
 * prefetching now, rather than when the LRU evicts it, which in a large
 * cache comes dozens of reads later: the back-off learnt too late, after
 * whole hints of wasted reads. Those used count for it in acquire_start's
 * counters, as before. Caller holds mu. */
static void judge_hint(struct shoal_expert_store *s, int64_t il)
{
    const int64_t NE = s->ct->n_expert;
    for (int64_t k = 0; k < s->hint_n_read[il]; k++) {
        struct entry *e = s->slot[il * NE + s->hint_read[il * NE + k]];
        if (!e || !e->prefetched || e->pf_judged || e->refs > 0)
            continue;   /* gone, used before, or used now */
        e->pf_judged = 1;
        s->pf_worth *= PF_DECAY;
    }
    s->hint_n_read[il] = 0;
}

int shoal_expert_store_acquire_start(struct shoal_expert_store *s, int64_t il,
                                     const int32_t *ids, int64_t n, struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    const int64_t NE = ct->n_expert;
    if (il < 0 || il >= ct->n_layer || ct->layer_offset[il] == UINT64_MAX)
        return shoal_err_set(err, SHOAL_EINVAL, "layer %lld has no routed experts in '%s'",
                             (long long)il, ct->dir);
    if (n < 1 || n > NE || s->held_n)
        return shoal_err_set(err, SHOAL_EINVAL, "acquire of %lld experts of layer %lld "
                             "(at most %lld, and not while a batch of %lld is held)",
                             (long long)n, (long long)il, (long long)NE,
                             (long long)s->held_n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= NE)
            return shoal_err_set(err, SHOAL_EINVAL, "expert id %d out of range [0, %lld) "
                                 "at layer %lld", ids[i], (long long)NE, (long long)il);
    for (int64_t i = 0; i < n; i++)
        if (!shoal_container_holds(ct, il, ids[i]))
            return shoal_err_set(err, SHOAL_ENOTFOUND, "layer %lld expert %d is not in this "
                                 "shard (%s holds %lld of %lld experts)", (long long)il,
                                 ids[i], ct->dir, (long long)ct->n_held,
                                 (long long)ct->n_moe_expert);
    struct entry **held = s->held;
    uint8_t *kind = s->held_kind;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (s->last_il >= 0 && s->last_il != il)
        s->hint_valid[s->last_il] = 0;   /* that layer's step is over */
    s->last_il = il;
    s->batch_staged = 0;
    /* 0: drop reads ahead that this acquire and the next layer's do not want */
    for (int k = s->n_ahead - 1; k >= 0; k--) {
        const struct entry *a = s->ahead[k];
        int want = a->il == il + 1;
        for (int64_t i = 0; a->il == il && i < n && !want; i++)
            want = ids[i] == a->ie;
        if (!want)
            ahead_drop(s, k);
    }
    /* 1: hold what is resident or on its way, so that making room below
     *    cannot evict it; a prefetch that failed is read again */
    for (int64_t i = 0; i < n; i++) {
        struct entry *e = s->slot[il * NE + ids[i]];
        if (e && e->state == ENTRY_FAILED && e->refs == 0 && e->tier == TIER_CACHE) {
            cache_drop(s, e, 0);
            e = NULL;
        }
        held[i] = e;
        if (!e)
            continue;
        kind[i] = e->tier == TIER_PINNED ? HELD_PINNED
                : e->state == ENTRY_LOADING ? HELD_INFLIGHT : HELD_CACHED;
        demand(s, e);
        if (e->tier != TIER_PINNED)
            e->refs++;
    }
    /* 2: buffers for the missing ones, in order, while there is room; the
     *    staging area is free between batches, so at least one fits */
    int64_t m = n;
    for (int64_t i = 0; i < n; i++) {
        if (held[i])
            continue;
        struct entry *e = s->slot[il * NE + ids[i]];   /* a duplicate id */
        int fresh = 0;
        const int k = e ? -1 : ahead_find(s, il, ids[i]);
        if (k >= 0) {   /* read ahead: the batch takes it, blob and all */
            e = ahead_take(s, k);
            demand(s, e);
            e->refs++;
            held[i] = e;
            kind[i] = e->prefetched ? HELD_INFLIGHT : HELD_AHEAD;
            continue;
        }
        if (!e) {
            if (!(e = new_entry(s, il, ids[i], &rc, err))) {
                if (!rc && i == 0)
                    rc = shoal_err_set(err, SHOAL_ENOMEM, "no staging blob free for "
                                       "layer %lld", (long long)il);
                m = i;
                break;
            }
            fresh = 1;
        }
        if (e->tier != TIER_PINNED)
            e->refs++;
        held[i] = e;
        kind[i] = fresh ? HELD_DISK : HELD_INFLIGHT;
        if (fresh) {
            s->st.disk_reads++;
            start_read(s, e);
        }
    }
    /* 3: let go of what lies beyond the part acquired now (cache entries
     *    held in 1: step 2 stops at the first expert it cannot place), and
     *    read ahead what the next part misses */
    for (int64_t i = m; i < n; i++) {
        if (held[i])
            unhold(s, held[i]);
        held[i] = NULL;
    }
    for (int64_t i = m; i < n && !rc; i++)
        if (!s->slot[il * NE + ids[i]] && ahead_start(s, il, ids[i], 0))
            s->st.read_ahead++;
    if (rc) {
        /* reads already started must land before their buffers go */
        wait_loaded(s, held, m);
        for (int64_t i = 0; i < m; i++)
            unhold(s, held[i]);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    if (s->hint_valid[il] && m == n)
        judge_hint(s, il);
    /* counters: tiers, prefetch use, hint recall; recency order, counts */
    const int hinted = s->hint_valid[il];
    for (int64_t i = 0; i < m; i++) {
        struct entry *e = held[i];
        uint64_t *use = s->use + (il * NE + ids[i]) * SHOAL_EXPERT_N_TIERS;
        switch ((enum held_kind)kind[i]) {
        case HELD_PINNED: s->st.pinned_hits++; use[SHOAL_EXPERT_TIER_PINNED]++; break;
        case HELD_CACHED: s->st.cache_hits++; use[SHOAL_EXPERT_TIER_CACHE]++; break;
        case HELD_INFLIGHT: s->st.inflight_hits++; use[SHOAL_EXPERT_TIER_CACHE]++; break;
        case HELD_DISK: use[SHOAL_EXPERT_TIER_DISK]++; break;
        case HELD_AHEAD:
            s->st.disk_reads++;
            s->st.staged_reads++;
            use[SHOAL_EXPERT_TIER_DISK]++;
            break;
        }
        if (e->prefetched) {
            s->st.prefetch_used++;
            s->pf_worth = s->pf_worth * PF_DECAY + (1.0 - PF_DECAY);
            e->prefetched = 0;
        }
        if (e->tier == TIER_CACHE) {
            lru_unlink(s, e);
            lru_push_front(s, e);
        }
        if (s->freq)
            freq_count(s, il * NE + ids[i]);
        if (hinted) {
            s->st.used_after_hint++;
            s->st.used_hinted += s->hint_mark[il * NE + ids[i]] == s->hint_gen[il];
        }
    }
    s->held_n = m;
    s->held_il = il;
    s->held_started = 1;
    pthread_mutex_unlock(&s->mu);
    return (int)m;
}

int shoal_expert_store_acquire_wait(struct shoal_expert_store *s,
                                    struct shoal_expert_weights *out, struct shoal_err *err)
{
    const struct shoal_container *ct = s->ct;
    struct entry **held = s->held;
    const int64_t m = s->held_n;
    int rc = 0;
    if (!s->held_started)
        return shoal_err_set(err, SHOAL_EINVAL, "acquire_wait without acquire_start");
    pthread_mutex_lock(&s->mu);
    s->held_started = 0;
    double t0 = shoal_time_s();
    int waited = 0;
    for (int64_t i = 0; i < m; i++) {
        while (held[i]->state == ENTRY_LOADING) {
            waited = 1;
            pthread_cond_wait(&s->cv, &s->mu);
        }
    }
    if (waited)
        s->st.stall_seconds += shoal_time_s() - t0;
    for (int64_t i = 0; i < m && !rc; i++)
        if (held[i]->state == ENTRY_FAILED)
            rc = shoal_err_set(err, held[i]->failed_code, "%s%s", held[i]->failed_msg,
                               held[i]->tried & (held[i]->tried - 1) ?
                               " (every source failed)" : "");
    if (rc) {
        for (int64_t i = 0; i < m; i++) {
            unhold(s, held[i]);
            held[i] = NULL;
        }
        s->held_n = 0;
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    pthread_mutex_unlock(&s->mu);
    for (int64_t i = 0; i < m; i++)
        shoal_container_expert_views_at(ct, held[i]->il, held[i]->ie, held[i]->blob, &out[i]);
    return 0;
}

int shoal_expert_store_acquire_batch(struct shoal_expert_store *s, int64_t il,
                                     const int32_t *ids, int64_t n,
                                     struct shoal_expert_weights *out,
                                     struct shoal_err *err)
{
    int m = shoal_expert_store_acquire_start(s, il, ids, n, err);
    if (m < 0)
        return m;
    int rc = shoal_expert_store_acquire_wait(s, out, err);
    return rc < 0 ? rc : m;
}

void shoal_expert_store_release_batch(struct shoal_expert_store *s, int64_t il,
                                      const int32_t *ids, int64_t m)
{
    (void)ids;
    if (il != s->held_il || m != s->held_n)
        shoal_log(SHOAL_LOG_WARN, "expert_store", "release of %lld experts of layer %lld "
                  "does not match the batch held (%lld of layer %lld); releasing that",
                  (long long)m, (long long)il, (long long)s->held_n, (long long)s->held_il);
    pthread_mutex_lock(&s->mu);
    s->held_started = 0;
    wait_loaded(s, s->held, s->held_n);   /* released without a wait: reads must land */
    for (int64_t i = 0; i < s->held_n; i++) {
        unhold(s, s->held[i]);
        s->held[i] = NULL;
    }
    s->held_n = 0;
    pthread_mutex_unlock(&s->mu);
}

int shoal_expert_store_acquire(struct shoal_expert_store *s, int64_t il, int64_t ie,
                               struct shoal_expert_weights *out, struct shoal_err *err)
{
    if (ie < 0 || ie >= s->ct->n_expert)
        return shoal_err_set(err, SHOAL_EINVAL, "expert id %lld out of range [0, %lld)",
                             (long long)ie, (long long)s->ct->n_expert);
    int32_t id = (int32_t)ie;
    int rc = shoal_expert_store_acquire_batch(s, il, &id, 1, out, err);
    return rc < 0 ? rc : 0;
}

void shoal_expert_store_release(struct shoal_expert_store *s, int64_t il, int64_t ie)
{
    int32_t id = (int32_t)ie;
    shoal_expert_store_release_batch(s, il, &id, 1);
}

/* ------------------------------------------------------------ hints */

/* How a hint is to be acted on now (enum hint_mode): in full while
 * prefetching pays, else one call in PF_PROBE is a probe (HINT_PROBE); a
 * decision wants_hints made is taken as it is, without counting again.
 * Caller holds mu. */
static int hint_due(struct shoal_expert_store *s)
{
    if (s->pf_probe_pass) {
        const int due = s->pf_probe_pass;
        s->pf_probe_pass = HINT_SKIP;
        return due;
    }
    if (s->pf_worth >= PF_BACKOFF)
        return HINT_FULL;
    if (s->pf_skip++ % PF_PROBE) {
        s->st.hints_backed_off++;
        return HINT_SKIP;
    }
    return HINT_PROBE;
}

int shoal_expert_store_wants_hints(struct shoal_expert_store *s)
{
    if (!s->p.prefetch)
        return 0;
    pthread_mutex_lock(&s->mu);
    const int due = hint_due(s);
    s->pf_probe_pass = due;   /* the hint that follows is this decision's */
    pthread_mutex_unlock(&s->mu);
    return due != HINT_SKIP;
}

int shoal_expert_store_resident_bits(struct shoal_expert_store *s, int64_t il, uint8_t *bits,
                                     uint8_t *loading)
{
    const struct shoal_container *ct = s->ct;
    const int64_t NE = ct->n_expert;
    if (il < 0 || il >= ct->n_layer || ct->layer_offset[il] == UINT64_MAX)
        return -1;
    memset(bits, 0, (size_t)((NE + 7) / 8));
    if (loading)
        memset(loading, 0, (size_t)((NE + 7) / 8));
    pthread_mutex_lock(&s->mu);
    for (int64_t ie = 0; ie < NE; ie++) {
        const struct entry *e = s->slot[il * NE + ie];
        if (!e || e->state == ENTRY_FAILED)
            continue;
        bits[ie >> 3] |= (uint8_t)(1u << (ie & 7));
        if (loading && e->state == ENTRY_LOADING)
            loading[ie >> 3] |= (uint8_t)(1u << (ie & 7));
    }
    for (int k = 0; k < s->n_ahead; k++) {
        const struct entry *e = s->ahead[k];
        if (e->il != il || e->state == ENTRY_FAILED)
            continue;
        bits[e->ie >> 3] |= (uint8_t)(1u << (e->ie & 7));
        if (loading && e->state == ENTRY_LOADING)
            loading[e->ie >> 3] |= (uint8_t)(1u << (e->ie & 7));
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int shoal_expert_store_layer_resident(struct shoal_expert_store *s, int64_t il)
{
    if (il < 0 || il >= s->ct->n_layer)
        return 0;
    pthread_mutex_lock(&s->mu);
    const int all = s->layer_held[il] > 0 && s->layer_ready[il] == s->layer_held[il];
    pthread_mutex_unlock(&s->mu);
    return all;
}

void shoal_expert_store_hint(struct shoal_expert_store *s, int64_t il, const int32_t *ids,
                             int64_t n_ids)
{
    const struct shoal_container *ct = s->ct;
    const int64_t NE = ct->n_expert;
    if (!s->p.prefetch || il < 0 || il >= ct->n_layer || ct->layer_offset[il] == UINT64_MAX)
        return;
    pthread_mutex_lock(&s->mu);
    const int mode = hint_due(s);
    if (mode == HINT_SKIP) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    int64_t reads = 0;   /* started by this call */
    const uint32_t gen = ++s->hint_gen[il];
    s->hint_valid[il] = 1;
    s->hint_n_read[il] = 0;   /* a hint not followed by its step is not judged */
    s->st.hints++;
    for (int64_t i = 0; i < n_ids; i++) {
        const int32_t ie = ids[i];
        if (ie < 0 || ie >= NE || s->hint_mark[il * NE + ie] == gen ||
            !shoal_container_holds(ct, il, ie))
            continue;   /* another worker's expert when ct is a shard */
        s->hint_mark[il * NE + ie] = gen;
        s->st.hinted++;
        struct entry *e = s->slot[il * NE + ie];
        if ((e && !(e->state == ENTRY_FAILED && e->refs == 0 && e->tier == TIER_CACHE)) ||
            ahead_find(s, il, ie) >= 0)
            continue;   /* resident or on its way */
        if (mode == HINT_PROBE && reads >= PF_PROBE_READS)
            continue;   /* a probe measures with a few reads */
        if (e)
            cache_drop(s, e, 0);
        void *blob = NULL;
        const uint64_t bytes = shoal_container_blob_bytes(ct, il);
        if (!make_room(s, bytes, il, il * NE + ie) || !(blob = blob_get(s, bytes))) {
            if (ahead_start(s, il, ie, 1)) {   /* not in the cache: into staging */
                s->st.prefetch_reads++;
                s->st.prefetch_staged++;
                reads++;
            } else {
                s->st.prefetch_dropped++;
            }
            continue;
        }
        e = shoal_xcalloc(1, sizeof *e);
        *e = (struct entry){.s = s, .blob = blob, .bytes = bytes, .il = il, .ie = ie,
                            .tier = TIER_CACHE, .prefetched = 1};
        lru_push_front(s, e);
        s->slot[il * NE + ie] = e;
        s->st.cached_bytes += bytes;
        s->st.cached_experts++;
        note_peak(s);
        s->st.prefetch_reads++;
        s->hint_read[il * NE + s->hint_n_read[il]++] = ie;
        reads++;
        start_read(s, e);
    }
    pthread_mutex_unlock(&s->mu);
}

void shoal_expert_store_learn(struct shoal_expert_store *s, int64_t il, const int32_t *ids,
                              int64_t n_tok, int64_t k)
{
    if (il == s->first_moe)
        s->st.tokens += (uint64_t)(n_tok > 0 ? n_tok : 0);
    if (!s->hot || !s->p.learn)
        return;
    for (int64_t i = 0; i < n_tok * k; i++)
        shoal_hot_set_add(s->hot, il, ids[i], 1.0);
}

/* ------------------------------------------------------------ stats */

void shoal_expert_store_stats_get(const struct shoal_expert_store *s,
                                  struct shoal_expert_store_stats *out)
{
    struct shoal_expert_store *w = (struct shoal_expert_store *)s;   /* the lock only */
    pthread_mutex_lock(&w->mu);
    *out = s->st;
    const double now = shoal_time_s();
    if (s->inflight > 0)
        out->read_busy_seconds += now - s->busy_since;
    out->io_engine = s->io ? shoal_io_engine_name(s->io) : "none";
    out->cache_policy = shoal_cache_policy_name(s->p.cache_policy);
    out->queue_depth = s->queue_depth;
    out->counts_path = s->hot ? shoal_hot_set_file(s->hot) : NULL;
    out->n_source = s->n_source;
    for (int i = 0; i < s->n_source; i++) {
        out->source[i] = s->src[i].st;
        if (s->src[i].inflight > 0)
            out->source[i].busy_seconds += now - s->src[i].busy_since;
    }
    pthread_mutex_unlock(&w->mu);
}

void shoal_expert_store_use_get(const struct shoal_expert_store *s, uint64_t *out)
{
    struct shoal_expert_store *w = (struct shoal_expert_store *)s;   /* the lock only */
    const size_t n = (size_t)(s->ct->n_layer * s->ct->n_expert) * SHOAL_EXPERT_N_TIERS;
    pthread_mutex_lock(&w->mu);
    memcpy(out, s->use, n * sizeof *out);
    pthread_mutex_unlock(&w->mu);
}
