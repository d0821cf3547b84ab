/* omp_env: shoal's default OpenMP wait policy (see omp_env.h). */
#include "omp_env.h"

#include "config.h"

#include <dlfcn.h>
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
    /* the variables are set now, so the new image returns above */
    execv("/proc/self/exe", argv);
#else
    (void)argv;
#endif
keep_runtime_default:
    /* the environment should say what this process runs with */
    unsetenv("GOMP_SPINCOUNT");
    unsetenv("KMP_BLOCKTIME");
}
