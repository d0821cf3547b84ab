/* test_fs: file-tree helpers for the unit tests, without a subprocess.
 *
 * system("rm -rf ...") forks the test process; a test that has started
 * threads (the expert store's io threads) can then deadlock in the child
 * under qemu-user, which the aarch64 run uses (seen: a child blocked on a
 * futex before exec, forever). These walk the tree in-process instead.
 * Thread: the test's own. */
#ifndef SHOAL_TEST_FS_H
#define SHOAL_TEST_FS_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int test_fs_unlink_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) == 0 ? 0 : -1;
}

/* Remove dir and everything under it (not following symlinks). A missing
 * dir is success. Returns 0 or -1 (errno set). */
static inline int test_rm_rf(const char *dir)
{
    struct stat st;
    if (lstat(dir, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    return nftw(dir, test_fs_unlink_one, 16, FTW_DEPTH | FTW_PHYS);
}

static const char *test_fs_copy_src, *test_fs_copy_dst;

static int test_fs_copy_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)ftw;
    char to[4096];
    if (snprintf(to, sizeof to, "%s%s", test_fs_copy_dst, path + strlen(test_fs_copy_src)) >=
        (int)sizeof to)
        return -1;
    if (flag == FTW_D)
        return mkdir(to, st->st_mode & 07777) == 0 || errno == EEXIST ? 0 : -1;
    if (flag != FTW_F)
        return -1;   /* symlinks and the like: not in test fixtures */
    int in = open(path, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, st->st_mode & 07777);
    int rc = in >= 0 && out >= 0 ? 0 : -1;
    char buf[65536];
    for (ssize_t n; rc == 0 && (n = read(in, buf, sizeof buf)) != 0;) {
        if (n < 0 || write(out, buf, (size_t)n) != n)
            rc = -1;
    }
    if (in >= 0)
        close(in);
    if (out >= 0 && close(out) != 0)
        rc = -1;
    return rc;
}

/* Copy the tree src to dst (dst must not exist; created with src's mode).
 * Regular files and directories only. Returns 0 or -1. */
static inline int test_cp_r(const char *src, const char *dst)
{
    test_fs_copy_src = src;
    test_fs_copy_dst = dst;
    return nftw(src, test_fs_copy_one, 16, FTW_PHYS);
}

#endif
