/* plan_speed: will a planned model (plan.h) run on these machines, with
 * how much memory where, and at how many tokens a second (`shoal plan`).
 *
 * The model of a token (docs/OPERATIONS.md, "How the planner predicts"):
 *   memory   the coordinator (machine 0) holds the trunk, the KV cache at
 *            --ctx and a reserve for the OS; every machine that serves
 *            experts gives the rest of its RAM to the expert cache, minus
 *            the store's staging (2 x queue depth x one expert);
 *   hits     the cache is an LRU (expert_store.h); its hit rate follows
 *            from the cache's share of the experts and the routing skew by
 *            simulating that LRU, token by token and layer after layer in
 *            the engine's order, each expert asked with probability
 *            n_expert_used x its share (Che's closed form, H. Che et al.,
 *            IEEE JSAC 20(7), 2002, was 0.09 high when the cache holds about
 *            one token's experts: tests/reference/test_plan_speed.py);
 *   skew     each MoE layer's expert shares: the container's own routing
 *            counts when given, else one curve fitted to the real routing
 *            traces in ../shared/data (OLMoE-1B-7B, 64 experts top-8, layers
 *            0/7/15, five domains; SHOAL_PLAN_SKEW below);
 *   decode   trunk, KV and cached experts read at the RAM bandwidth times
 *            the efficiency shoal's warm token reaches (SHOAL_PLAN_DECODE_EFF),
 *            misses read from disk at its rate (times SHOAL_PLAN_MISS_COST,
 *            the prefetch reads that go unused) plus one latency per layer
 *            that misses, a fixed cost per layer and per routed expert, and
 *            for each MoE layer
 *            served over the network one round trip plus the bytes at the
 *            slower of each worker's link and the coordinator's, which
 *            carries them all (full duplex: the larger direction counts); with several machines a layer waits
 *            for the slowest one's RAM reads and round trip (expected over
 *            the routing by sampling), while disk reads run on across
 *            layers (the prefetch keeps each disk busy): the busiest disk's
 *            total overlaps the rest (SHOAL_PLAN_OVERLAP_LOSS);
 *   prefill  per MoE layer the prompt's batch-union of experts is read once
 *            and every routed row computed at the machine's GEMM rate times
 *            SHOAL_PLAN_PREFILL_EFF; the trunk's rows likewise; disk reads
 *            overlap compute; steady-state caches, and empty ones (cold).
 *
 * Units: bytes, bytes per second, seconds, FLOP per second.
 * Thread: any (plain data; no global state).
 */
#ifndef SHOAL_PLAN_SPEED_H
#define SHOAL_PLAN_SPEED_H

#include <stdint.h>

#include "err.h"
#include "plan.h"

#define SHOAL_PLAN_MAX_MACHINES 64
/* Fraction of the RAM-read bound a warm shoal decode token reaches (bytes
 * of trunk, KV and experts read / RAM read bandwidth / time), measured by
 * `shoal bench --state warm` on the machines in docs/BENCHMARKS.md, against
 * the read probe on 4 KiB pages (before 2026-12-07). The probe now reads
 * from 2 MiB pages (pages.h), 1.2-1.7x more on a Zen 4 VM while decode did
 * not move, so a probe in a fast minute makes `shoal plan --measure`
 * predict high there; bench/plan_check --only inram on that VM with the
 * probe at 30.6 GB/s: decode +11, -30, -25 % (not refitted: that VM's probe
 * swings 30-64 GB/s within minutes). */
#define SHOAL_PLAN_DECODE_EFF 0.85
/* Fraction of the GEMM probe's rate a prefill reaches on experts' and
 * trunk rows (batches split over experts, activations quantized per
 * row), measured by `shoal bench --prompt-len 512` beside the probe. */
#define SHOAL_PLAN_PREFILL_EFF 0.75
/* Fixed cost of one layer of a decode token (thread fork/join, norms,
 * RoPE, the combine), seconds. */
#define SHOAL_PLAN_LAYER_S 25e-6
/* Fixed cost of one routed expert in a decode token (the store's acquire
 * and release, three matvecs' fork/join), seconds: what makes a model of
 * small experts slower than its bytes say (bench/plan_check, 0.4 GB). */
#define SHOAL_PLAN_EXPERT_S 15e-6
/* Disk reads per expert miss in decode: the router lookahead's prefetch
 * also reads experts that go unused, 1 / precision of them (precision 86 %
 * measured with small caches); decode with --prefetch off ran 15 % faster
 * on a throttled disk (docs/BENCHMARKS_LOG.md). */
#define SHOAL_PLAN_MISS_COST 1.15
/* Decode's disk reads overlap its RAM, compute and wire time (the router
 * lookahead prefetches the next layer's experts): a token takes the longer
 * of the two plus this share of the shorter, the experts the lookahead
 * misses (recall 80-85 % measured) being read on demand. With 100 Mbit
 * links, a worker's disk-bound decode matched the same cache in-process. */
#define SHOAL_PLAN_OVERLAP_LOSS 0.2
/* One-time cost in the first prompt of a process (first touch of the
 * activation scratch and the KV cache, the OpenMP pool), seconds:
 * measured 30-110 ms beside the model of a 64-token prefill. */
#define SHOAL_PLAN_PREFILL_START_S 0.05
/* Latency of one random expert read on an SSD, seconds. */
#define SHOAL_PLAN_DISK_LATENCY_S 100e-6
/* The expert store's default reads in flight: its staging holds twice as
 * many experts besides the cache (expert_store.h: a batch's and reads
 * ahead). */
#define SHOAL_PLAN_QUEUE_DEPTH 8

/* One machine. Zero fields take the planner's defaults. */
struct shoal_plan_machine {
    uint64_t ram;          /* bytes of RAM */
    double mem_bw;         /* RAM read bandwidth, bytes/s */
    double disk_bw;        /* random expert-sized reads at queue depth, bytes/s */
    double flops;          /* expert GEMM rate at the experts' dtype, FLOP/s */
    double link_bw;        /* its network link, bytes/s each way (full duplex);
                              0: env.link_bw. Machine 0's carries every
                              worker's traffic */
};

struct shoal_plan_env {
    int n_machine;                         /* 1 .. SHOAL_PLAN_MAX_MACHINES */
    struct shoal_plan_machine m[SHOAL_PLAN_MAX_MACHINES]; /* [0]: the coordinator */
    uint64_t reserve;                      /* bytes kept for the OS on every machine */
    double link_bw;                        /* bytes/s of a machine's link where its
                                              own link_bw is 0 */
    double link_rtt;                       /* round trip, seconds */
    int coordinator_experts;               /* 1: the coordinator's store serves experts
                                              too (--local-experts on) */
    int64_t prompt;                        /* prefill tokens; decode is predicted at
                                              this context */
    /* routing shares [n_moe_layer][n_expert] (each row sums to 1), borrowed,
     * or NULL for the default curve */
    const double *shares;
};

/* Where the time of one token goes, seconds. */
struct shoal_plan_time {
    double ram;            /* trunk, KV and cached experts */
    double disk;           /* expert misses */
    double link;           /* round trips and bytes on the wire */
    double compute;        /* GEMM rows (prefill) */
    double fixed;          /* per-layer costs */
    double total;
    const char *bound;     /* the largest term: "RAM bandwidth", "disk reads",
                              "link", "compute", "per-layer overhead" */
};

struct shoal_plan_mem {
    uint64_t ram, reserve, trunk, kv, staging;
    uint64_t cache;        /* the expert cache (--expert-cache) */
    uint64_t held;         /* experts this machine serves (all layers) */
    uint64_t cache_experts;/* experts its cache holds */
    double hit;            /* expected cache hit rate of its expert reads */
    int serves;            /* serves experts */
};

struct shoal_plan_speed {
    int fits;                              /* 1: runs; 0: reason says why not */
    char reason[256];
    int n_machine, n_serving;
    struct shoal_plan_mem mem[SHOAL_PLAN_MAX_MACHINES];
    double hit;                            /* over every expert read of a token */
    uint64_t token_disk_bytes;             /* expected expert bytes from disk per token */
    uint64_t token_link_bytes;             /* bytes on the wire per decode token */
    double round_trips;                    /* per decode token */
    struct shoal_plan_time decode;         /* one token at env.prompt of context */
    struct shoal_plan_time prefill;        /* the whole prompt, caches in steady state */
    struct shoal_plan_time prefill_cold;   /* the same with empty expert caches (the
                                              first prompt after start) */
    double decode_tps, prefill_tps, prefill_cold_tps;
};

/* Default curve: the share of routings that go to the hottest fraction x
 * of a layer's experts, at x = 0, 1/16, ..., 1 (a Lorenz curve). */
extern const double SHOAL_PLAN_SKEW[17];

/* The shares of n_expert experts under the default curve, hottest first
 * (out[n_expert], sums to 1). Thread: any. */
void shoal_plan_default_shares(int64_t n_expert, double *out);

/* Expected LRU hit rate of items each asked with probability r[n] (0..1)
 * per token, in index order, with a cache of c items: a simulated LRU
 * (fixed seed: the same figure every call; about 300 000 asks after a
 * warm-up). Per-item hit rates in item_hit[n] when not NULL (0 for an item
 * never asked). c >= n gives 1. Returns the rate, or -1 without memory.
 * Thread: any. */
double shoal_plan_lru_hit(const double *r, int64_t n, double c, double *item_hit);

/* Predict o (sized with p) on env. Returns 0 with out filled (a model that
 * does not fit is out->fits = 0 with the first reason, not an error), or
 * a negative status with one line in err for contradictions (no machine,
 * coordinator_experts off with one machine, a non-positive rate).
 * Thread: any. */
int shoal_plan_speed(const struct shoal_plan *o, const struct shoal_plan_params *p,
                     const struct shoal_plan_env *env, struct shoal_plan_speed *out,
                     struct shoal_err *err);

#endif
