#include "bench_probe.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <omp.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memread.h"
#include "pages.h"
#include "util.h"

extern char **environ;

/* ---- small helpers ---------------------------------------------------------- */

static void jset(json_t *o, const char *k, json_t *v)
{
    json_object_set_new(o, k, v ? v : json_null());
}

/* First line of a small file, trailing whitespace cut; NULL if unreadable.
 * Owned by the caller. */
static char *read_line(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char buf[512];
    char *r = fgets(buf, sizeof buf, f);
    fclose(f);
    if (!r)
        return NULL;
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        buf[--n] = '\0';
    return shoal_xstrdup(buf);
}

static json_t *jstr_owned(char *s)
{
    json_t *j = s ? json_string(s) : json_null();
    free(s);
    return j ? j : json_null();   /* json_string refuses invalid UTF-8 */
}

/* Read everything from fd until EOF into a NUL-terminated buffer (owned). */
static char *read_all(int fd, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = shoal_xmalloc(cap);
    for (;;) {
        if (n + 1 == cap) {
            cap *= 2;
            buf = shoal_xrealloc(buf, cap);
        }
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* ---- child processes ---------------------------------------------------------- */

json_t *shoal_bench_fork_json(int (*fn)(void *user, json_t **out), void *user,
                              struct shoal_err *err)
{
    int fds[2];
    if (pipe(fds) != 0) {
        shoal_err_set(err, -errno, "bench: pipe: %s", strerror(errno));
        return NULL;
    }
    fflush(stdout);
    fflush(stderr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(fds[0]);
        close(fds[1]);
        shoal_err_set(err, -e, "bench: fork: %s", strerror(e));
        return NULL;
    }
    if (pid == 0) {
        close(fds[0]);
#if defined(__linux__)
        /* die with the parent: a killed benchmark leaves no probe running */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(1);   /* the parent is already gone */
#else
        (void)parent;
#endif
        json_t *out = NULL;
        int rc = fn(user, &out);
        if (out) {
            char *text = json_dumps(out, JSON_COMPACT);
            size_t n = text ? strlen(text) : 0, off = 0;
            while (off < n) {
                ssize_t w = write(fds[1], text + off, n - off);
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0)
                    break;
                off += (size_t)w;
            }
        }
        close(fds[1]);
        fflush(stdout);
        fflush(stderr);
        _exit(rc ? 1 : 0);
    }
    close(fds[1]);
    size_t len = 0;
    char *text = read_all(fds[0], &len);
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    json_t *j = NULL;
    if (len) {
        json_error_t jerr;
        j = json_loadb(text, len, 0, &jerr);
        if (!j)
            shoal_err_set(err, SHOAL_EFORMAT, "bench: child %d wrote %zu bytes that are not "
                          "JSON (%s at byte %d)", (int)pid, len, jerr.text, jerr.position);
    } else if (WIFSIGNALED(status)) {
        shoal_err_set(err, SHOAL_EIO, "bench: child %d died on signal %d (%s)", (int)pid,
                      WTERMSIG(status), strsignal(WTERMSIG(status)));
    } else {
        shoal_err_set(err, SHOAL_EIO, "bench: child %d exited with status %d without a "
                      "result (its error is on stderr above)", (int)pid,
                      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    free(text);
    return j;
}

/* ---- machine ------------------------------------------------------------------ */

json_t *shoal_bench_loadavg(void)
{
    double la[3];
    if (getloadavg(la, 3) != 3)
        return json_null();
    return json_pack("[f, f, f]", la[0], la[1], la[2]);
}

static void cpu_info(json_t *m)
{
    char *model = NULL;
    int avx2 = 0, avx512f = 0, neon = 0, dotprod = 0, i8mm = 0, have_flags = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[8192];
        while (fgets(line, sizeof line, f)) {
            char *colon = strchr(line, ':');
            if (!colon)
                continue;
            char *v = colon + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t n = strlen(v);
            while (n && (v[n - 1] == '\n' || v[n - 1] == ' '))
                v[--n] = '\0';
            if (!model && (!strncmp(line, "model name", 10) || !strncmp(line, "Model", 5)))
                model = shoal_xstrdup(v);
            if (!have_flags && (!strncmp(line, "flags", 5) || !strncmp(line, "Features", 8))) {
                have_flags = 1;
                char padded[8192];
                snprintf(padded, sizeof padded, " %s ", v);
                avx2 = strstr(padded, " avx2 ") != NULL;
                avx512f = strstr(padded, " avx512f ") != NULL;
                neon = strstr(padded, " asimd ") != NULL || strstr(padded, " neon ") != NULL;
                dotprod = strstr(padded, " asimddp ") != NULL;   /* sdot */
                i8mm = strstr(padded, " i8mm ") != NULL;         /* smmla */
            }
        }
        fclose(f);
    }
    jset(m, "cpu", jstr_owned(model));
    jset(m, "cores", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    if (have_flags) {
        jset(m, "avx2", json_boolean(avx2));
        jset(m, "avx512f", json_boolean(avx512f));
        jset(m, "neon", json_boolean(neon));
        jset(m, "neon_dotprod", json_boolean(dotprod));
        jset(m, "neon_i8mm", json_boolean(i8mm));
    }
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    jset(m, "ram_bytes", pages > 0 && psz > 0 ? json_integer((json_int_t)pages * psz) : NULL);
}

/* Undo mountinfo's octal escapes (\040 for a space) in place. */
static void unescape_mount(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* The mount holding real path rp: the longest mount point that is a
 * prefix of rp at a path-component boundary (from /proc/self/mountinfo). */
static void mount_info(const char *rp, json_t *st)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f)
        return;
    char line[4096], best_mp[PATH_MAX] = "", best_fs[64] = "", best_src[PATH_MAX] = "";
    size_t best_len = 0;
    while (fgets(line, sizeof line, f)) {
        /* id parent maj:min root mountpoint options [optional...] - fstype source super */
        char root[PATH_MAX], mp[PATH_MAX];
        if (sscanf(line, "%*s %*s %*s %4095s %4095s", root, mp) != 2)
            continue;
        char *dash = strstr(line, " - ");
        if (!dash)
            continue;
        char fs[64], src[PATH_MAX];
        if (sscanf(dash + 3, "%63s %4095s", fs, src) != 2)
            continue;
        unescape_mount(mp);
        size_t n = strlen(mp);
        int prefix = !strcmp(mp, "/") ||
                     (!strncmp(rp, mp, n) && (rp[n] == '/' || rp[n] == '\0'));
        if (prefix && (n >= best_len || !best_mp[0])) {
            best_len = n;
            snprintf(best_mp, sizeof best_mp, "%s", mp);
            snprintf(best_fs, sizeof best_fs, "%s", fs);
            snprintf(best_src, sizeof best_src, "%s", src);
        }
    }
    fclose(f);
    if (best_mp[0]) {
        jset(st, "mount", json_string(best_mp));
        jset(st, "fstype", json_string(best_fs));
        jset(st, "source", json_string(best_src));
    }
}

/* The whole-disk block device of st_dev (a partition's parent), from
 * /sys/dev/block/MAJ:MIN: queue settings, driver, model, size. */
static void block_info(dev_t dev, json_t *st)
{
    char link[128], real[PATH_MAX];
    snprintf(link, sizeof link, "/sys/dev/block/%u:%u", major(dev), minor(dev));
    if (!realpath(link, real))
        return;
    char part[PATH_MAX + 16];
    snprintf(part, sizeof part, "%s/partition", real);
    if (shoal_exists(part)) {
        char *slash = strrchr(real, '/');
        if (slash)
            *slash = '\0';
    }
    const char *name = strrchr(real, '/') ? strrchr(real, '/') + 1 : real;
    jset(st, "device", json_string(name));
    char p[PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/queue/rotational", real);
    char *rot = read_line(p);
    jset(st, "rotational", rot ? json_boolean(rot[0] == '1') : NULL);
    free(rot);
    snprintf(p, sizeof p, "%s/queue/scheduler", real);
    jset(st, "scheduler", jstr_owned(read_line(p)));
    snprintf(p, sizeof p, "%s/device/model", real);
    jset(st, "model", jstr_owned(read_line(p)));
    snprintf(p, sizeof p, "%s/size", real);
    char *sz = read_line(p);
    jset(st, "size_bytes", sz ? json_integer(strtoll(sz, NULL, 10) * 512) : NULL);
    free(sz);
    snprintf(p, sizeof p, "%s/device/driver", real);
    char drv[PATH_MAX];
    if (realpath(p, drv)) {
        const char *d = strrchr(drv, '/');
        jset(st, "driver", json_string(d ? d + 1 : drv));
    }
}

json_t *shoal_bench_machine(const char *path)
{
    json_t *m = json_object();
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    jset(m, "hostname", json_string(host));
    struct utsname u;
    if (uname(&u) == 0) {
        jset(m, "os", json_string(u.sysname));
        jset(m, "kernel", json_string(u.release));
        jset(m, "arch", json_string(u.machine));
    }
    cpu_info(m);
    json_t *st = json_object();
    char rp[PATH_MAX];
    if (path && realpath(path, rp)) {
        jset(st, "path", json_string(rp));
        mount_info(rp, st);
        struct stat sb;
        if (stat(rp, &sb) == 0 && major(sb.st_dev) != 0)
            block_info(sb.st_dev, st);
        struct statvfs vf;
        if (statvfs(rp, &vf) == 0)
            jset(st, "free_bytes", json_integer((json_int_t)vf.f_bavail * (json_int_t)vf.f_frsize));
    }
    jset(m, "storage", st);
    return m;
}

/* ---- cold state ------------------------------------------------------------------ */

double shoal_bench_resident(const char *path)
{
    /* since Linux 5.2, mincore() on a file the caller could not write
     * reports every page resident (a side-channel fix), so it says
     * nothing then */
    if (geteuid() != 0 && access(path, W_OK) != 0)
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat sb;
    double frac = -1;
    if (fstat(fd, &sb) == 0 && sb.st_size > 0) {
        void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
            const size_t psz = (size_t)sysconf(_SC_PAGESIZE);
            const size_t n = ((size_t)sb.st_size + psz - 1) / psz;
            unsigned char *vec = malloc(n);
            if (vec && mincore(p, (size_t)sb.st_size, vec) == 0) {
                size_t res = 0;
                for (size_t i = 0; i < n; i++)
                    res += vec[i] & 1;
                frac = (double)res / (double)n;
            }
            free(vec);
            munmap(p, (size_t)sb.st_size);
        }
    }
    close(fd);
    return frac;
}

/* One regular file p (stat sb) of shoal_bench_evict: its pages dropped
 * with posix_fadvise unless the whole cache was (dropped), counted in
 * *files; the largest file seen kept in largest[n] / *largest_size. */
static void evict_file(const char *p, const struct stat *sb, int dropped, int *files,
                       char *largest, size_t n, off_t *largest_size)
{
    if (!dropped) {
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
            (*files)++;
        }
    }
    if (sb->st_size > *largest_size) {
        *largest_size = sb->st_size;
        snprintf(largest, n, "%s", p);
    }
}

json_t *shoal_bench_evict(const char *const *dirs, int n_dirs)
{
    json_t *o = json_object();
    double t0 = shoal_time_s();
    sync();
    int dropped = 0;
    char why[256] = "";
    if (geteuid() == 0) {
        int fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
        if (fd >= 0 && write(fd, "3\n", 2) == 2)
            dropped = 1;
        else
            snprintf(why, sizeof why, "root, but /proc/sys/vm/drop_caches: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
    } else {
        snprintf(why, sizeof why, "not root (euid %u): the page cache cannot be dropped",
                 (unsigned)geteuid());
    }
    int files = 0;
    char largest[PATH_MAX] = "";
    off_t largest_size = -1;
    for (int d = 0; d < n_dirs; d++) {
        struct stat sb;
        if (stat(dirs[d], &sb) == 0 && S_ISREG(sb.st_mode)) {   /* a file: itself */
            evict_file(dirs[d], &sb, dropped, &files, largest, sizeof largest, &largest_size);
            continue;
        }
        DIR *dp = opendir(dirs[d]);
        if (!dp)
            continue;
        struct dirent *e;
        while ((e = readdir(dp))) {
            char *p = shoal_path_join(dirs[d], e->d_name);
            if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode))
                evict_file(p, &sb, dropped, &files, largest, sizeof largest, &largest_size);
            free(p);
        }
        closedir(dp);
    }
    jset(o, "method", json_string(dropped ? "drop_caches" : "fadvise"));
    jset(o, "how", json_string(dropped ? "sync; echo 3 > /proc/sys/vm/drop_caches"
                                       : "sync; posix_fadvise(POSIX_FADV_DONTNEED) on every "
                                         "file of the model (its directory's, or its GGUF files)"));
    if (!dropped) {
        jset(o, "why", json_string(why));
        jset(o, "files", json_integer(files));
    }
    if (largest[0]) {
        double r = shoal_bench_resident(largest);
        jset(o, "resident_after", r >= 0 ? json_real(r) : NULL);
        jset(o, "resident_file", json_string(largest));
        if (r < 0)
            jset(o, "resident_unknown", json_string(
                "mincore() cannot tell for a file this user cannot write (Linux >= 5.2 "
                "reports every page resident)"));
    }
    jset(o, "seconds", json_real(shoal_time_s() - t0));
    return o;
}

/* ---- fio ------------------------------------------------------------------------ */

/* Find prog on PATH; returns 1 if an executable is there. */
static int on_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (!path)
        path = "/usr/bin:/bin";
    char *copy = shoal_xstrdup(path), *save = NULL;
    int found = 0;
    for (char *dir = strtok_r(copy, ":", &save); dir && !found;
         dir = strtok_r(NULL, ":", &save)) {
        char *p = shoal_path_join(dir, prog);
        found = access(p, X_OK) == 0;
        free(p);
    }
    free(copy);
    return found;
}

/* Spawn argv (argv[0] looked up on PATH) with stdout captured and stderr
 * captured too; returns the exit status (-1: could not start). *out and
 * *errout are owned by the caller. */
static int run_capture(char *const *argv, char **out, char **errout)
{
    int po[2], pe[2];
    *out = *errout = NULL;
    if (pipe(po) != 0)
        return -1;
    if (pipe(pe) != 0) {
        close(po[0]);
        close(po[1]);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    posix_spawn_file_actions_addclose(&fa, po[0]);
    posix_spawn_file_actions_addclose(&fa, pe[0]);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(po[1]);
    close(pe[1]);
    if (rc != 0) {
        close(po[0]);
        close(pe[0]);
        return -1;
    }
    /* fio's JSON is small and its stderr is a few lines: reading one pipe
     * to EOF before the other cannot deadlock at these sizes */
    size_t n;
    *out = read_all(po[0], &n);
    *errout = read_all(pe[0], &n);
    close(po[0]);
    close(pe[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static char *join_argv(char *const *argv)
{
    size_t n = 1;
    for (int i = 0; argv[i]; i++)
        n += strlen(argv[i]) + 1;
    char *s = shoal_xmalloc(n);
    s[0] = '\0';
    for (int i = 0; argv[i]; i++) {
        if (i)
            strcat(s, " ");
        strcat(s, argv[i]);
    }
    return s;
}

json_t *shoal_bench_fio(const struct shoal_bench_fio_params *p)
{
    if (!on_path("fio"))
        return json_pack("{s:s}", "skipped", "fio is not installed (not on PATH; Debian: "
                                              "apt-get install fio)");
    if (p->bs == 0 || p->size < p->bs)
        return json_pack("{s:s}", "skipped", "the file region is smaller than one request");
    static const char *engines[] = {"io_uring", "libaio", "psync"};
    json_t *last_err = NULL;
    for (size_t ie = 0; ie < sizeof engines / sizeof engines[0]; ie++) {
        int qd = strcmp(engines[ie], "psync") ? p->iodepth : 1;
        char a_file[PATH_MAX + 16], a_engine[64], a_bs[64], a_qd[64], a_off[64], a_size[64],
            a_rt[64];
        snprintf(a_file, sizeof a_file, "--filename=%s", p->path);
        snprintf(a_engine, sizeof a_engine, "--ioengine=%s", engines[ie]);
        snprintf(a_bs, sizeof a_bs, "--bs=%llu", (unsigned long long)p->bs);
        snprintf(a_qd, sizeof a_qd, "--iodepth=%d", qd);
        snprintf(a_off, sizeof a_off, "--offset=%llu", (unsigned long long)p->offset);
        snprintf(a_size, sizeof a_size, "--size=%llu",
                 (unsigned long long)(p->size / p->bs * p->bs));
        snprintf(a_rt, sizeof a_rt, "--runtime=%g", p->runtime_s > 0 ? p->runtime_s : 5.0);
        char *argv[] = {"fio", "--name=blobs", a_file, "--readonly", "--rw=randread",
                        "--direct=1", a_engine, a_bs, a_qd, a_off, a_size, "--time_based",
                        a_rt, "--ramp_time=1", "--randrepeat=0", "--norandommap",
                        "--output-format=json", NULL};
        char *out = NULL, *errout = NULL;
        int rc = run_capture(argv, &out, &errout);
        char *cmd = join_argv(argv);
        json_t *res = NULL;
        const char *brace = out ? strchr(out, '{') : NULL;
        json_t *j = rc == 0 && brace ? json_loads(brace, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
        json_t *rd = json_object_get(json_array_get(json_object_get(j, "jobs"), 0), "read");
        if (json_is_object(rd) && json_number_value(json_object_get(rd, "bw_bytes")) > 0) {
            json_t *lat = json_object_get(rd, "clat_ns");
            if (!json_is_object(lat))
                lat = json_object_get(rd, "lat_ns");
            res = json_pack("{s:f, s:f, s:f, s:s, s:I, s:i, s:s}",
                            "mb_per_s", json_number_value(json_object_get(rd, "bw_bytes")) / 1e6,
                            "iops", json_number_value(json_object_get(rd, "iops")),
                            "clat_ms_mean", json_number_value(json_object_get(lat, "mean")) / 1e6,
                            "engine", engines[ie], "bs", (json_int_t)p->bs, "iodepth", qd,
                            "cmd", cmd);
        } else {
            /* fio's complaint, last line */
            const char *msg = errout && *errout ? errout : out ? out : "";
            size_t n = strlen(msg);
            while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
                n--;
            size_t start = n > 300 ? n - 300 : 0;
            json_decref(last_err);
            last_err = json_pack("{s:s#, s:s, s:i}", "error", msg + start, (int)(n - start),
                                 "cmd", cmd, "status", rc);
        }
        json_decref(j);
        free(cmd);
        free(out);
        free(errout);
        if (res) {
            json_decref(last_err);
            return res;
        }
    }
    return last_err;
}

/* ---- RAM probe ------------------------------------------------------------------- */

/* AnonHugePages of this process in bytes, or -1 where Linux's
 * /proc/self/smaps_rollup does not say */
static double anon_huge_bytes(void)
{
    char *text = NULL;
    size_t len = 0;
    struct shoal_err err = {0};
    if (shoal_read_file("/proc/self/smaps_rollup", 1u << 16, &text, &len, &err))
        return -1;
    const char *v = strstr(text, "AnonHugePages:");
    const double kb = v ? strtod(v + 14, NULL) : -1;
    free(text);
    return kb < 0 ? -1 : kb * 1024.0;
}

/* the share (0..1) of `bytes` just touched that the kernel put on 2 MiB
 * pages: AnonHugePages now over what it was before (`before`, from
 * anon_huge_bytes; the probe's child inherits its parent's mappings), or
 * -1 when unknown */
static double anon_huge_share(double before, double bytes)
{
    const double now = anon_huge_bytes();
    if (before < 0 || now < 0 || bytes <= 0)
        return -1;
    const double sh = (now - before) / bytes;
    return sh < 0 ? 0 : sh > 1 ? 1 : sh;
}

static int ram_child(void *user, json_t **out)
{
    const struct shoal_bench_ram_params *p = user;
    if (p->threads > 0)
        omp_set_num_threads(p->threads);
    const size_t n = (size_t)p->array_mib * (1u << 20) / sizeof(double);
    /* on huge pages where the kernel offers them, as the expert buffers
     * are (pages.h): the bound is what the memory can give */
    const size_t bytes = n * sizeof(double);
    const double huge_before = anon_huge_bytes();
    double *a = shoal_pages_map(bytes), *b = shoal_pages_map(bytes), *c = shoal_pages_map(bytes);
    double *part = calloc(1024, sizeof *part);
    if (!a || !b || !c || !part) {
        *out = json_pack("{s:s}", "error", "ram probe: cannot allocate its arrays");
        shoal_pages_unmap(a, bytes);
        shoal_pages_unmap(b, bytes);
        shoal_pages_unmap(c, bytes);
        free(part);
        return 1;
    }
    int nth = 1;
    double best[3] = {1e30, 1e30, 1e30}, sink = 0, huge_share = -1;
    const int reps = p->reps > 0 ? p->reps : 1;
    /* one parallel region for the whole probe, each thread on a static
     * slice it first-touched itself (pages land on its node); partial sums
     * are per thread and combined by one thread in index order */
#pragma omp parallel
    {
        const int ith = omp_get_thread_num(), nt = omp_get_num_threads();
        const size_t lo = n * (size_t)ith / (size_t)nt, hi = n * (size_t)(ith + 1) / (size_t)nt;
#pragma omp single
        nth = nt;
        for (size_t i = lo; i < hi; i++) {
            a[i] = 1.0;
            b[i] = 2.0;
            c[i] = 0.5;
        }
#pragma omp barrier
#pragma omp master
        huge_share = anon_huge_share(huge_before, 3.0 * (double)bytes);   /* all touched now */
        for (int r = 0; r < reps; r++) {
            double t0 = 0, t1 = 0, t2 = 0, t3 = 0;
#pragma omp barrier
#pragma omp master
            t0 = shoal_time_s();
            /* the widest loads with independent accumulators
             * (memread.h): a scalar 8-byte XOR read ~20 % below it */
            const uint64_t x = shoal_mem_read_xor(a + lo, (hi - lo) * sizeof *a);
            if (ith < 1024)
                part[ith] = (double)(x & 0xffff);
#pragma omp barrier
#pragma omp master
            t1 = shoal_time_s();
            for (size_t i = lo; i < hi; i++)
                c[i] = a[i];
#pragma omp barrier
#pragma omp master
            t2 = shoal_time_s();
            for (size_t i = lo; i < hi; i++)
                a[i] = b[i] + 3.0 * c[i];
#pragma omp barrier
#pragma omp master
            {
                t3 = shoal_time_s();
                for (int k = 0; k < nt && k < 1024; k++)
                    sink += part[k];
                double t[3] = {t1 - t0, t2 - t1, t3 - t2};
                for (int k = 0; k < 3; k++)
                    if (t[k] < best[k])
                        best[k] = t[k];
            }
        }
    }
    *out = json_pack("{s:i, s:I, s:i, s:f, s:f, s:f, s:f, s:f}", "threads", nth, "array_mib",
                     (json_int_t)p->array_mib, "reps", reps, "read_gbs", (double)bytes / best[0] / 1e9,
                     "copy_gbs", 2.0 * (double)bytes / best[1] / 1e9, "triad_gbs",
                     3.0 * (double)bytes / best[2] / 1e9, "checksum", sink, "huge_page_share",
                     huge_share);
    shoal_pages_unmap(a, bytes);
    shoal_pages_unmap(b, bytes);
    shoal_pages_unmap(c, bytes);
    free(part);
    return 0;
}

json_t *shoal_bench_ram(const struct shoal_bench_ram_params *p)
{
    struct shoal_err err = {0};
    if (p->array_mib < 1)
        return json_pack("{s:s}", "skipped", "array size 0");
    struct shoal_bench_ram_params q = *p;
    json_t *j = shoal_bench_fork_json(ram_child, &q, &err);
    if (!j)
        return json_pack("{s:s}", "error", err.msg);
    json_object_set_new(j, "kernel", json_string("read: x ^= bits(a[i]) (8 B/elem), copy (16 B), "
                                                 "triad a = b + 3c (24 B); best of reps"));
    return j;
}
