/* io_engine: both backends read the right bytes in parallel, report errors
 * through the callback exactly once, refuse bad submissions without calling
 * back, cancel on destroy, and io_uring falls back to pread (logged) when
 * the ring cannot be set up. */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "io_engine.h"
#include "io_engine_impl.h"
#include "log.h"

#ifdef __linux__
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#endif

#define FILE_BYTES (1 << 20)
#define N_REQ 200

static char path[64];
static unsigned char *pattern;   /* [FILE_BYTES] the file's bytes */

static void make_file(void)
{
    snprintf(path, sizeof path, "/tmp/shoal-io-XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    pattern = malloc(FILE_BYTES);
    uint64_t x = 0x9e3779b97f4a7c15ull;   /* fixed seed, xorshift64 */
    for (size_t i = 0; i < FILE_BYTES; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        pattern[i] = (unsigned char)x;
    }
    cr_assert(pattern[0] != pattern[1] || pattern[1] != pattern[2], "generator is not constant");
    cr_assert(eq(i64, (int64_t)write(fd, pattern, FILE_BYTES), FILE_BYTES));
    close(fd);
}

static void drop_file(void)
{
    unlink(path);
    free(pattern);
}

/* completion bookkeeping shared by the callbacks */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int n_done;
static int calls[N_REQ];

static void on_done(struct shoal_io_req *req)
{
    pthread_mutex_lock(&mu);
    calls[(intptr_t)req->user_data]++;
    n_done++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_done(int n)
{
    pthread_mutex_lock(&mu);
    while (n_done < n)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

static void parallel_reads(enum shoal_io_kind kind, const char *want_name)
{
    make_file();
    struct shoal_io_engine_params p = {.kind = kind, .queue_depth = 4};
    struct shoal_err err = {0};
    struct shoal_io_engine *e = shoal_io_engine_create(p, &err);
    cr_assert(e != NULL, "%s", err.msg);
    if (want_name)
        cr_assert(eq(str, (char *)shoal_io_engine_name(e), (char *)want_name));
    cr_assert(eq(int, shoal_io_engine_queue_depth(e), 4));
    int fd = open(path, O_RDONLY);
    static struct shoal_io_req req[N_REQ];
    static unsigned char *buf[N_REQ];
    uint64_t x = 12345;
    for (int i = 0; i < N_REQ; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t len = 1 + (size_t)(x >> 33) % 65536;           /* 1 B .. 64 KiB, odd sizes */
        uint64_t off = (x >> 13) % (FILE_BYTES - len + 1);
        buf[i] = malloc(len);
        req[i] = (struct shoal_io_req){.fd = fd, .buf = buf[i], .len = len, .off = off,
                                       .cb = on_done, .user_data = (void *)(intptr_t)i};
        cr_assert(eq(int, shoal_io_engine_submit(e, &req[i], &err), 0), "%s", err.msg);
    }
    wait_done(N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        cr_assert(eq(int, calls[i], 1), "request %d completed %d times", i, calls[i]);
        cr_assert(eq(i64, req[i].result, (int64_t)req[i].len), "request %d", i);
        cr_assert(eq(int, memcmp(buf[i], pattern + req[i].off, req[i].len), 0),
                  "request %d: bytes at offset %llu differ", i,
                  (unsigned long long)req[i].off);
        free(buf[i]);
    }
    shoal_io_engine_destroy(e);
    close(fd);
    drop_file();
}

Test(io_engine, pread_pool_parallel_reads_land_correctly, .timeout = 60)
{
    parallel_reads(SHOAL_IO_PREAD, "pread");
}

Test(io_engine, uring_parallel_reads_land_correctly, .timeout = 60)
{
    /* without liburing (or without a usable ring) this is the pread pool */
    parallel_reads(SHOAL_IO_URING, NULL);
}

/* A 2-deep engine of kind and the test file, open read-only in *fd. */
static struct shoal_io_engine *engine_on_file(enum shoal_io_kind kind, int *fd)
{
    make_file();
    struct shoal_err err = {0};
    struct shoal_io_engine *e = shoal_io_engine_create(
        (struct shoal_io_engine_params){.kind = kind, .queue_depth = 2}, &err);
    cr_assert(e != NULL);
    *fd = open(path, O_RDONLY);
    return e;
}

/* Requests 0 and 1 called back once each; then close everything. */
static void engine_done(struct shoal_io_engine *e, int fd)
{
    cr_assert(eq(int, calls[0], 1));
    cr_assert(eq(int, calls[1], 1));
    shoal_io_engine_destroy(e);
    close(fd);
    drop_file();
}

static void errors_reach_callback(enum shoal_io_kind kind)
{
    struct shoal_err err = {0};
    int fd;
    struct shoal_io_engine *e = engine_on_file(kind, &fd);
    static unsigned char b0[16], b1[4096];
    struct shoal_io_req bad_fd = {.fd = 1 << 20, .buf = b0, .len = sizeof b0, .off = 0,
                                  .cb = on_done, .user_data = (void *)0};
    struct shoal_io_req past_eof = {.fd = fd, .buf = b1, .len = sizeof b1,
                                    .off = FILE_BYTES - 100, .cb = on_done,
                                    .user_data = (void *)1};
    cr_assert(eq(int, shoal_io_engine_submit(e, &bad_fd, &err), 0));
    cr_assert(eq(int, shoal_io_engine_submit(e, &past_eof, &err), 0));
    wait_done(2);
    cr_assert(eq(i64, bad_fd.result, -EBADF));
    cr_assert(eq(i64, past_eof.result, SHOAL_EIO), "a read past the end is an error, not short");
    engine_done(e, fd);
}

Test(io_engine, pread_errors_reach_the_callback_once, .timeout = 30)
{
    errors_reach_callback(SHOAL_IO_PREAD);
}

Test(io_engine, uring_errors_reach_the_callback_once, .timeout = 30)
{
    errors_reach_callback(SHOAL_IO_URING);
}

/* min_len: a page-rounded read of a file's tail (a GGUF expert's last
 * page) ends at the end of the file with the bytes it read, when they are
 * enough; otherwise it is still an error */
static void tail_reads(enum shoal_io_kind kind)
{
    struct shoal_err err = {0};
    int fd;
    struct shoal_io_engine *e = engine_on_file(kind, &fd);
    static unsigned char b0[8192], b1[8192];
    memset(b0, 0xee, sizeof b0);
    struct shoal_io_req enough = {.fd = fd, .buf = b0, .len = sizeof b0, .off = FILE_BYTES - 4096,
                                  .min_len = 4000, .cb = on_done, .user_data = (void *)0};
    struct shoal_io_req short_ = {.fd = fd, .buf = b1, .len = sizeof b1, .off = FILE_BYTES - 4096,
                                  .min_len = 4097, .cb = on_done, .user_data = (void *)1};
    cr_assert(eq(int, shoal_io_engine_submit(e, &enough, &err), 0));
    cr_assert(eq(int, shoal_io_engine_submit(e, &short_, &err), 0));
    wait_done(2);
    cr_assert(eq(i64, enough.result, 4096), "the bytes up to the end of the file");
    cr_assert(eq(int, memcmp(b0, pattern + FILE_BYTES - 4096, 4096), 0));
    cr_assert(eq(int, b0[4096], 0xee), "nothing written past them");
    cr_assert(eq(i64, short_.result, SHOAL_EIO), "fewer than min_len bytes is an error");
    engine_done(e, fd);
}

Test(io_engine, pread_tail_read_ends_at_eof_with_min_len, .timeout = 30)
{
    tail_reads(SHOAL_IO_PREAD);
}

Test(io_engine, uring_tail_read_ends_at_eof_with_min_len, .timeout = 30)
{
    tail_reads(SHOAL_IO_URING);
}

Test(io_engine, bad_submit_fails_and_never_calls_back, .timeout = 30)
{
    struct shoal_err err = {0};
    struct shoal_io_engine *e = shoal_io_engine_create(shoal_io_engine_params_default(), &err);
    cr_assert(e != NULL);
    static unsigned char b[8];
    struct shoal_io_req no_cb = {.fd = 0, .buf = b, .len = sizeof b};
    struct shoal_io_req no_len = {.fd = 0, .buf = b, .len = 0, .cb = on_done};
    cr_assert(eq(int, shoal_io_engine_submit(e, &no_cb, &err), SHOAL_EINVAL));
    cr_assert(strstr(err.msg, "callback") != NULL, "%s", err.msg);
    cr_assert(eq(int, shoal_io_engine_submit(e, &no_len, NULL), SHOAL_EINVAL));
    shoal_io_engine_destroy(e);
    cr_assert(eq(int, n_done, 0), "no callback may run for a refused submit");
}

static void destroy_cancels(enum shoal_io_kind kind)
{
    make_file();
    struct shoal_err err = {0};
    struct shoal_io_engine *e = shoal_io_engine_create(
        (struct shoal_io_engine_params){.kind = kind, .queue_depth = 1}, &err);
    cr_assert(e != NULL);
    int fd = open(path, O_RDONLY);
    static struct shoal_io_req req[N_REQ];
    static unsigned char buf[N_REQ][4096];
    for (int i = 0; i < N_REQ; i++) {
        req[i] = (struct shoal_io_req){.fd = fd, .buf = buf[i], .len = 4096,
                                       .off = (uint64_t)i * 4096, .cb = on_done,
                                       .user_data = (void *)(intptr_t)i};
        cr_assert(eq(int, shoal_io_engine_submit(e, &req[i], &err), 0));
    }
    shoal_io_engine_destroy(e);   /* returns after every callback ran */
    cr_assert(eq(int, n_done, N_REQ));
    int cancelled = 0;
    for (int i = 0; i < N_REQ; i++) {
        cr_assert(eq(int, calls[i], 1), "request %d completed %d times", i, calls[i]);
        cr_assert(req[i].result == 4096 || req[i].result == SHOAL_ECANCELED,
                  "request %d result %lld", i, (long long)req[i].result);
        if (req[i].result == 4096)
            cr_assert(eq(int, memcmp(buf[i], pattern + i * 4096, 4096), 0));
        cancelled += req[i].result == SHOAL_ECANCELED;
    }
    cr_log_info("%d of %d queued reads were cancelled", cancelled, N_REQ);
    close(fd);
    drop_file();
}

Test(io_engine, pread_destroy_completes_or_cancels_every_read, .timeout = 30)
{
    destroy_cancels(SHOAL_IO_PREAD);
}

Test(io_engine, uring_destroy_completes_or_cancels_every_read, .timeout = 30)
{
    destroy_cancels(SHOAL_IO_URING);
}

/* log capture: count warning lines from the io engine */
static int n_warn;
static char last_warn[1024];

static void sink(enum shoal_log_level level, const char *component, const char *line,
                 void *user)
{
    (void)user;
    if (level == SHOAL_LOG_WARN && !strcmp(component, "io_engine")) {
        n_warn++;
        snprintf(last_warn, sizeof last_warn, "%s", line);
    }
}

Test(io_engine, uring_falls_back_to_pread_with_one_logged_line, .timeout = 30)
{
#if HAVE_LIBURING && defined(__linux__)
    /* block io_uring_setup the way container runtimes' seccomp profiles do */
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog))
        cr_skip_test("cannot install a seccomp filter here (%s)", strerror(errno));
    const char *want = "io_uring_queue_init";
#else
    const char *want = "liburing is not built in";
#endif
    shoal_log_set_sink(sink, NULL);
    struct shoal_err err = {0};
    struct shoal_io_engine *e = shoal_io_engine_create(
        (struct shoal_io_engine_params){.kind = SHOAL_IO_URING, .queue_depth = 3}, &err);
    cr_assert(e != NULL, "%s", err.msg);
    cr_assert(eq(str, (char *)shoal_io_engine_name(e), "pread"));
    cr_assert(shoal_io_engine_fallback_reason(e) != NULL);
    cr_assert(strstr(shoal_io_engine_fallback_reason(e), want) != NULL, "reason: %s",
              shoal_io_engine_fallback_reason(e));
    cr_assert(eq(int, n_warn, 1), "one warning line, got %d", n_warn);
    cr_assert(strstr(last_warn, "pread") != NULL, "%s", last_warn);
    /* and the fallback engine works */
    make_file();
    int fd = open(path, O_RDONLY);
    static unsigned char b[1000];
    struct shoal_io_req r = {.fd = fd, .buf = b, .len = sizeof b, .off = 777, .cb = on_done};
    cr_assert(eq(int, shoal_io_engine_submit(e, &r, &err), 0));
    wait_done(1);
    cr_assert(eq(i64, r.result, (int64_t)sizeof b));
    cr_assert(eq(int, memcmp(b, pattern + 777, sizeof b), 0));
    shoal_io_engine_destroy(e);
    close(fd);
    drop_file();
    shoal_log_set_sink(NULL, NULL);
}

Test(io_engine, auto_is_uring_when_built_in_and_silent_otherwise, .timeout = 30)
{
    shoal_log_set_sink(sink, NULL);
    struct shoal_err err = {0};
    struct shoal_io_engine *e = shoal_io_engine_create(shoal_io_engine_params_default(), &err);
    cr_assert(e != NULL);
#if !HAVE_LIBURING
    cr_assert(eq(str, (char *)shoal_io_engine_name(e), "pread"));
    cr_assert(eq(int, n_warn, 0), "auto without liburing is not a fallback");
    cr_assert(shoal_io_engine_fallback_reason(e) == NULL);
#else
    /* uring, or pread with exactly one warning when the ring is refused */
    cr_assert(strcmp(shoal_io_engine_name(e), "uring") == 0 || n_warn == 1);
#endif
    shoal_io_engine_destroy(e);
    shoal_log_set_sink(NULL, NULL);
}

Test(io_engine, kind_parse_accepts_the_three_names)
{
    enum shoal_io_kind k;
    cr_assert(eq(int, shoal_io_kind_parse("pread", &k), 0));
    cr_assert(eq(int, (int)k, SHOAL_IO_PREAD));
    cr_assert(eq(int, shoal_io_kind_parse("uring", &k), 0));
    cr_assert(eq(int, (int)k, SHOAL_IO_URING));
    cr_assert(eq(int, shoal_io_kind_parse("auto", &k), 0));
    cr_assert(eq(int, (int)k, SHOAL_IO_AUTO));
    cr_assert(eq(int, shoal_io_kind_parse("aio", &k), SHOAL_EINVAL));
}

/* The queue: urgent requests (demand reads) start before the others
 * (prefetches), each kind in the order it came. */
Test(io_engine, urgent_requests_queue_ahead_in_order)
{
    struct shoal_io_engine e;
    memset(&e, 0, sizeof e);
    struct shoal_io_req r[7];
    memset(r, 0, sizeof r);
    const int urgent[7] = {0, 0, 1, 0, 1, 1, 0};
    for (int i = 0; i < 5; i++) {   /* a b C d E */
        r[i].urgent = urgent[i];
        shoal_io_engine_enqueue_(&e, &r[i]);
    }
    cr_assert(eq(ptr, shoal_io_engine_pop_(&e), &r[2]));
    r[5].urgent = 1;   /* F after E, ahead of a b d */
    shoal_io_engine_enqueue_(&e, &r[5]);
    shoal_io_engine_enqueue_(&e, &r[6]);   /* g last */
    const int want[] = {4, 5, 0, 1, 3, 6};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(eq(ptr, shoal_io_engine_pop_(&e), &r[want[i]]), "pop %zu", i);
    cr_assert(eq(ptr, shoal_io_engine_pop_(&e), NULL));
    cr_assert(eq(ptr, e.tail, NULL));
    cr_assert(eq(ptr, e.urgent_tail, NULL));
    /* an urgent request into an empty queue is its head and tail */
    r[0].urgent = 1;
    shoal_io_engine_enqueue_(&e, &r[0]);
    cr_assert(e.head == &r[0] && e.tail == &r[0] && e.urgent_tail == &r[0]);
}

/* The queue: a background read's rest goes ahead of the other background
 * reads and behind the urgent ones; promote moves a queued one up. */
static void no_kick(struct shoal_io_engine *e)
{
    (void)e;
}

Test(io_engine, background_rest_requeues_first_and_promote_moves_up)
{
    static const struct shoal_io_engine_ops ops = {.name = "test", .kick = no_kick};
    struct shoal_io_engine e;
    memset(&e, 0, sizeof e);
    e.ops = &ops;
    pthread_mutex_init(&e.mu, NULL);
    pthread_cond_init(&e.cv, NULL);
    struct shoal_io_req r[5];
    memset(r, 0, sizeof r);
    const int urgent[5] = {1, 0, 0, 1, 0};
    for (int i = 0; i < 3; i++) {   /* A b c */
        r[i].urgent = urgent[i];
        shoal_io_engine_enqueue_(&e, &r[i]);
    }
    shoal_io_engine_requeue_bg_(&e, &r[4]);   /* e's rest: A e b c */
    r[3].urgent = 1;
    shoal_io_engine_enqueue_(&e, &r[3]);      /* A D e b c */
    shoal_io_engine_promote(&e, &r[2]);       /* A D C e b */
    cr_assert(eq(int, r[2].urgent, 1));
    shoal_io_engine_promote(&e, &r[0]);       /* urgent already: stays */
    const int want[] = {0, 3, 2, 4, 1};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_assert(eq(ptr, shoal_io_engine_pop_(&e), &r[want[i]]), "pop %zu", i);
    cr_assert(eq(ptr, shoal_io_engine_pop_(&e), NULL));
    cr_assert(eq(ptr, e.tail, NULL));
    shoal_io_engine_requeue_bg_(&e, &r[1]);   /* into an empty queue */
    cr_assert(e.head == &r[1] && e.tail == &r[1] && e.urgent_tail == NULL);
    shoal_io_engine_promote(&e, &r[1]);       /* the only one: head, tail, urgent tail */
    cr_assert(e.head == &r[1] && e.tail == &r[1] && e.urgent_tail == &r[1]);
    pthread_cond_destroy(&e.cv);
    pthread_mutex_destroy(&e.mu);
}

/* Both backends, one read at a time (queue depth 1): an urgent read queued
 * while a 48 MiB background read is under way lands before it (the
 * background one goes in pieces), a promoted background read before the
 * one under way, a cancelled one stops, and every byte read is right.
 * With one read at a time, a read that lands before one already under way
 * proves the engine stopped that one between pieces; an attempt where the
 * test thread was descheduled until it ended shows nothing and is run
 * again (at most ATTEMPTS times). */
#define BIG_BYTES ((size_t)48 << 20)
#define ATTEMPTS 20
static int order[4], n_order;

static void on_order(struct shoal_io_req *req)
{
    pthread_mutex_lock(&mu);
    order[n_order++] = (int)(intptr_t)req->user_data;
    n_done++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void reset_order(void)
{
    pthread_mutex_lock(&mu);
    n_order = n_done = 0;
    pthread_mutex_unlock(&mu);
}

static uint32_t big_word(size_t i)
{
    return (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 7);
}

/* Wait until the engine has taken every queued request (the one submitted
 * is under way). */
static void wait_taken(struct shoal_io_engine *e)
{
    for (;;) {
        pthread_mutex_lock(&e->mu);
        const int taken = e->head == NULL;
        pthread_mutex_unlock(&e->mu);
        if (taken)
            return;
        sched_yield();
    }
}

/* A BIG_BYTES file of big_word()s at big (a mkstemp template); its fd. */
static int make_big(char *big)
{
    int fd = mkstemp(big);
    cr_assert(fd >= 0);
    const size_t chunk = (size_t)1 << 20;
    uint32_t *w = malloc(chunk);
    for (size_t o = 0; o < BIG_BYTES; o += chunk) {
        for (size_t i = 0; i < chunk / 4; i++)
            w[i] = big_word(o / 4 + i);
        cr_assert(eq(i64, (int64_t)write(fd, w, chunk), (int64_t)chunk));
    }
    free(w);
    return fd;
}

/* A queue-depth-1 engine of kind over a fresh BIG_BYTES file. */
struct big_engine {
    char path[64];
    int fd;
    struct shoal_io_engine *e;
};

static void big_open(struct big_engine *b, enum shoal_io_kind kind)
{
    snprintf(b->path, sizeof b->path, "/tmp/shoal-io-big-XXXXXX");
    b->fd = make_big(b->path);
    struct shoal_err err = {0};
    b->e = shoal_io_engine_create(
        (struct shoal_io_engine_params){.kind = kind, .queue_depth = 1}, &err);
    cr_assert(b->e != NULL, "%s", err.msg);
}

static void big_close(struct big_engine *b)
{
    shoal_io_engine_destroy(b->e);
    close(b->fd);
    unlink(b->path);
}

static void background_yields(enum shoal_io_kind kind)
{
    struct big_engine big;
    big_open(&big, kind);
    struct shoal_io_engine *e = big.e;
    const int fd = big.fd;
    struct shoal_err err = {0};
    uint32_t *b0 = malloc(BIG_BYTES), *b1 = malloc(BIG_BYTES), *b2 = malloc(BIG_BYTES);
    uint32_t u[1024];
    const size_t half = BIG_BYTES / 2;
    int overtaken = 0, promoted = 0;
    for (int a = 0; a < ATTEMPTS && !overtaken; a++) {   /* an urgent read behind one under way */
        reset_order();
        struct shoal_io_req bg = {.fd = fd, .buf = b0, .len = BIG_BYTES, .cb = on_order,
                                  .user_data = (void *)0};
        struct shoal_io_req urg = {.fd = fd, .buf = u, .len = sizeof u, .off = 4096,
                                   .urgent = 1, .cb = on_order, .user_data = (void *)1};
        cr_assert(eq(int, shoal_io_engine_submit(e, &bg, &err), 0));
        wait_taken(e);
        cr_assert(eq(int, shoal_io_engine_submit(e, &urg, &err), 0));
        wait_done(2);
        overtaken = order[0] == 1;
        cr_assert(eq(i64, bg.result, (int64_t)BIG_BYTES));
        cr_assert(eq(i64, urg.result, (int64_t)sizeof u));
        for (size_t i = 0; i < BIG_BYTES / 4; i++)
            cr_assert(b0[i] == big_word(i), "word %zu of the background read", i);
        for (size_t i = 0; i < 1024; i++)
            cr_assert(u[i] == big_word(1024 + i), "word %zu of the urgent read", i);
    }
    cr_assert(overtaken, "an urgent read never landed before a background read under way");
    for (int a = 0; a < ATTEMPTS && !promoted; a++) {   /* promoted past the one under way */
        reset_order();
        struct shoal_io_req b_first = {.fd = fd, .buf = b1, .len = half, .off = 0,
                                       .cb = on_order, .user_data = (void *)2};
        struct shoal_io_req b_promo = {.fd = fd, .buf = b2, .len = half, .off = half,
                                       .cb = on_order, .user_data = (void *)3};
        cr_assert(eq(int, shoal_io_engine_submit(e, &b_first, &err), 0));
        wait_taken(e);
        cr_assert(eq(int, shoal_io_engine_submit(e, &b_promo, &err), 0));
        shoal_io_engine_promote(e, &b_promo);
        wait_done(2);
        promoted = order[0] == 3;
        cr_assert(eq(i64, b_first.result, (int64_t)half));
        cr_assert(eq(i64, b_promo.result, (int64_t)half));
        for (size_t i = 0; i < half / 4; i++) {
            cr_assert(b1[i] == big_word(i), "word %zu of the first half", i);
            cr_assert(b2[i] == big_word(half / 4 + i), "word %zu of the second half", i);
        }
    }
    cr_assert(promoted, "a promoted read never landed before a background read under way");
    big_close(&big);
    free(b0);
    free(b1);
    free(b2);
}

Test(io_engine, pread_background_reads_yield_to_urgent_and_promoted, .timeout = 60)
{
    background_yields(SHOAL_IO_PREAD);
}

Test(io_engine, uring_background_reads_yield_to_urgent_and_promoted, .timeout = 60)
{
    background_yields(SHOAL_IO_URING);
}

/* Cancel: a background read under way stops between pieces and a queued
 * one is never read, each called back once with -SHOAL_ECANCELED; an
 * urgent read beside them is not touched. Queue depth 1, both backends. */
static void cancel_stops(enum shoal_io_kind kind)
{
    struct big_engine big;
    big_open(&big, kind);
    struct shoal_io_engine *e = big.e;
    const int fd = big.fd;
    struct shoal_err err = {0};
    uint32_t *b0 = malloc(BIG_BYTES), *b1 = malloc(BIG_BYTES);
    uint32_t u[1024];
    int stopped = 0;
    for (int a = 0; a < ATTEMPTS && !stopped; a++) {
        reset_order();
        struct shoal_io_req under_way = {.fd = fd, .buf = b0, .len = BIG_BYTES,
                                         .cb = on_order, .user_data = (void *)0};
        struct shoal_io_req queued = {.fd = fd, .buf = b1, .len = BIG_BYTES, .cb = on_order,
                                      .user_data = (void *)1};
        struct shoal_io_req urg = {.fd = fd, .buf = u, .len = sizeof u, .off = 8192,
                                   .urgent = 1, .cb = on_order, .user_data = (void *)2};
        cr_assert(eq(int, shoal_io_engine_submit(e, &under_way, &err), 0));
        wait_taken(e);
        cr_assert(eq(int, shoal_io_engine_submit(e, &queued, &err), 0));
        cr_assert(eq(int, shoal_io_engine_submit(e, &urg, &err), 0));
        shoal_io_engine_cancel(e, &queued);
        shoal_io_engine_cancel(e, &under_way);
        wait_done(3);
        cr_assert(eq(int, n_order, 3), "each called back once");
        cr_assert(under_way.result == SHOAL_ECANCELED || under_way.result == (int64_t)BIG_BYTES,
                  "result %lld", (long long)under_way.result);
        cr_assert(queued.result == SHOAL_ECANCELED || queued.result == (int64_t)BIG_BYTES,
                  "result %lld", (long long)queued.result);
        cr_assert(eq(i64, urg.result, (int64_t)sizeof u));
        for (size_t i = 0; i < 1024; i++)
            cr_assert(u[i] == big_word(2048 + i), "word %zu of the urgent read", i);
        stopped = under_way.result == SHOAL_ECANCELED && queued.result == SHOAL_ECANCELED;
    }
    cr_assert(stopped, "a background read under way was never stopped between pieces");
    big_close(&big);
    free(b0);
    free(b1);
}

Test(io_engine, pread_cancel_stops_background_reads, .timeout = 60)
{
    cancel_stops(SHOAL_IO_PREAD);
}

Test(io_engine, uring_cancel_stops_background_reads, .timeout = 60)
{
    cancel_stops(SHOAL_IO_URING);
}

/* min_len in pieces: a background read ends at a short read that brought
 * min_len (mid-piece, or at the end of the file exactly at a piece's end),
 * never at a full piece's end. Both backends. */
static void background_min_len(enum shoal_io_kind kind)
{
    struct big_engine big;
    big_open(&big, kind);
    struct shoal_err err = {0};
    const size_t mib = (size_t)1 << 20;
    uint32_t *b[3];
    for (int i = 0; i < 3; i++)
        b[i] = malloc(8 * mib);
    struct shoal_io_req r[3] = {
        /* the tail, 1 MiB into the second piece */
        {.fd = big.fd, .buf = b[0], .len = 3 * mib + 4096, .off = BIG_BYTES - 3 * mib,
         .min_len = 3 * mib, .cb = on_order, .user_data = (void *)0},
        /* the tail, the end of the file at the second piece's end */
        {.fd = big.fd, .buf = b[1], .len = 4 * mib + 4096, .off = BIG_BYTES - 4 * mib,
         .min_len = 4 * mib, .cb = on_order, .user_data = (void *)1},
        /* min_len reached at a full piece's end, far from the end: read on */
        {.fd = big.fd, .buf = b[2], .len = 6 * mib, .off = 0, .min_len = 2 * mib,
         .cb = on_order, .user_data = (void *)2},
    };
    for (int i = 0; i < 3; i++)
        cr_assert(eq(int, shoal_io_engine_submit(big.e, &r[i], &err), 0), "%s", err.msg);
    wait_done(3);
    cr_assert(eq(i64, r[0].result, (int64_t)(3 * mib)));
    cr_assert(eq(i64, r[1].result, (int64_t)(4 * mib)));
    cr_assert(eq(i64, r[2].result, (int64_t)(6 * mib)), "not cut at a piece's end");
    for (int i = 0; i < 3; i++)
        for (size_t w = 0; w < (size_t)r[i].result / 4; w++)
            cr_assert(b[i][w] == big_word(r[i].off / 4 + w), "read %d word %zu", i, w);
    big_close(&big);
    for (int i = 0; i < 3; i++)
        free(b[i]);
}

Test(io_engine, pread_background_min_len_ends_at_a_short_read, .timeout = 60)
{
    background_min_len(SHOAL_IO_PREAD);
}

Test(io_engine, uring_background_min_len_ends_at_a_short_read, .timeout = 60)
{
    background_min_len(SHOAL_IO_URING);
}
