/* fuzz_common: memory accounting through the sanitizer allocator hooks and
 * small input helpers (see fuzz_common.h). */
#include "fuzz_common.h"

#include <sanitizer/allocator_interface.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tokenizer.h"

static atomic_int armed;
static atomic_llong live;        /* may dip below 0: frees of older blocks */
static atomic_llong peak;
static atomic_size_t biggest;
static atomic_size_t count;
/* allocations by this thread while armed, and its value at fuzz_mem_begin
 * (the executable's own TLS: reading it allocates nothing) */
static _Thread_local size_t count_here, count_here_base;

static long long charge(size_t n)
{
    return (long long)(((n + 15) & ~(size_t)15) + 16);
}

static void on_malloc(const volatile void *p, size_t n)
{
    (void)p;
    if (!atomic_load_explicit(&armed, memory_order_relaxed))
        return;
    long long l = atomic_fetch_add(&live, charge(n)) + charge(n);
    long long pk = atomic_load(&peak);
    while (l > pk && !atomic_compare_exchange_weak(&peak, &pk, l))
        ;
    size_t b = atomic_load(&biggest);
    while (n > b && !atomic_compare_exchange_weak(&biggest, &b, n))
        ;
    atomic_fetch_add(&count, 1);
    count_here++;
}

static void on_free(const volatile void *p)
{
    if (!p || !atomic_load_explicit(&armed, memory_order_relaxed))
        return;
    /* the hook runs before the block is released: its size is still known */
    size_t n = __sanitizer_get_allocated_size((const void *)p);
    atomic_fetch_sub(&live, charge(n));
}

void fuzz_mem_begin(void)
{
    static int installed;
    if (!installed) {
        __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
        installed = 1;
    }
    atomic_store(&live, 0);
    atomic_store(&peak, 0);
    atomic_store(&biggest, 0);
    atomic_store(&count, 0);
    count_here_base = count_here;
    atomic_store(&armed, 1);
}

struct fuzz_mem fuzz_mem_now(void)
{
    long long pk = atomic_load(&peak);
    return (struct fuzz_mem){.peak = pk > 0 ? (size_t)pk : 0,
                             .biggest = atomic_load(&biggest),
                             .count = atomic_load(&count),
                             .count_here = count_here - count_here_base};
}

void fuzz_mem_reset_peak(void)
{
    long long l = atomic_load(&live);
    atomic_store(&peak, l > 0 ? l : 0);
    atomic_store(&biggest, 0);
}

struct fuzz_mem fuzz_mem_end(void)
{
    atomic_store(&armed, 0);
    return fuzz_mem_now();
}

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    atomic_store(&armed, 0);
    fprintf(stderr, "fuzz: %s:%d: %s failed: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

void fuzz_mem_check(const char *target, const char *what, struct fuzz_mem m,
                    size_t input_len, size_t peak_budget, size_t block_budget)
{
    if (m.peak > peak_budget)
        fuzz_fail(__FILE__, __LINE__, "peak <= budget",
                  "%s: %s held %zu bytes at its peak (%zu allocations) for an input of %zu "
                  "bytes; the budget is %zu", target, what, m.peak, m.count, input_len,
                  peak_budget);
    if (m.biggest > block_budget)
        fuzz_fail(__FILE__, __LINE__, "block <= budget",
                  "%s: %s allocated one block of %zu bytes for an input of %zu bytes; the "
                  "budget is %zu", target, what, m.biggest, input_len, block_budget);
}

char *fuzz_strndup(const uint8_t *data, size_t n)
{
    char *s = malloc(n + 1);
    if (!s)
        abort();
    memcpy(s, data, n);
    s[n] = 0;
    return s;
}

const char *fuzz_as_file(const uint8_t *data, size_t n)
{
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("shoal-fuzz", 0);
        if (fd < 0) {
            perror("fuzz: memfd_create");
            abort();
        }
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, n, 0) != (ssize_t)n) {
        perror("fuzz: memfd write");
        abort();
    }
    return path;
}

int fuzz_split(const uint8_t *data, size_t n, const uint8_t **a, size_t *na,
               const uint8_t **b, size_t *nb)
{
    const uint8_t *z = n ? memchr(data, 0, n) : NULL;
    *a = data;
    *na = z ? (size_t)(z - data) : n;
    *b = z ? z + 1 : data + n;
    *nb = z ? n - *na - 1 : 0;
    return z != NULL;
}

void fuzz_encode_round(const struct shoal_tokenizer *tok, const uint8_t *text, size_t len,
                       int special, size_t max_ids)
{
    struct shoal_tokenize_params p = {.add_special = special, .parse_special = special};
    struct shoal_err err = {0};
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (shoal_tokenizer_encode(tok, (const char *)text, len, p, &ids, &n_ids, &err) != 0) {
        FUZZ_ASSERT(err.code < 0 && err.msg[0], "encode refused without a message");
        return;
    }
    FUZZ_ASSERT(n_ids <= max_ids, "%zu ids for %zu bytes, at most %zu", n_ids, len, max_ids);
    int32_t nv = shoal_tokenizer_n_vocab(tok);
    for (size_t i = 0; i < n_ids; i++)
        FUZZ_ASSERT(ids[i] >= 0 && ids[i] < nv, "id %d of %d", ids[i], nv);
    free(shoal_tokenizer_decode(tok, ids, n_ids, 0, &err));
    free(ids);
}
