/* omp_env: shoal's default OpenMP wait policy (see omp_env.h). */
#include "omp_env.h"

#include "config.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

static const char *const policy_keys[] = {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"};

/* 1 when the OpenMP runtime is LLVM's libomp, which reads its environment
 * at its first use; libgomp (and anything else) read it when loaded. */
static int runtime_reads_env_lazily(void)
{
    return dlsym(RTLD_DEFAULT, "kmp_set_blocktime") != NULL;
}

void shoal_omp_env_init(char **argv)
{
    for (size_t i = 0; i < sizeof policy_keys / sizeof policy_keys[0]; i++)
        if (getenv(policy_keys[i]))
            return;                          /* the user's choice */
    if (setenv("GOMP_SPINCOUNT", SHOAL_OMP_GOMP_SPINCOUNT, 0) ||
        setenv("KMP_BLOCKTIME", SHOAL_OMP_KMP_BLOCKTIME, 0))
        goto keep_runtime_default;
    if (runtime_reads_env_lazily())
        return;
#ifdef __linux__
    /* the variables are set now, so the new image returns above. The path,
     * not /proc/self/exe itself: under qemu-user that link names the guest
     * program only when read, while exec'ing it would start the emulator
     * with the guest's arguments; the path fails cleanly there without
     * binfmt_misc (ENOEXEC), and so does a binary replaced since start. */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        execv(self, argv);
    }
#else
    (void)argv;
#endif
keep_runtime_default:
    /* the environment should say what this process runs with */
    unsetenv("GOMP_SPINCOUNT");
    unsetenv("KMP_BLOCKTIME");
}
