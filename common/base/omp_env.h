/* omp_env: the OpenMP wait policy shoal runs with when the user chose none.
 *
 * A thread that reaches an OpenMP barrier first spins, then sleeps. The
 * runtimes' defaults spin long (libgomp ~300000 polls, a few ms; libomp
 * 200 ms): on a machine where other processes are busy the spinning thread
 * takes the CPU the thread it waits for needs, and decode collapses 10-100x
 * (docs/BENCHMARKS.md, "OpenMP wait policy"). Sleeping at once
 * (OMP_WAIT_POLICY=passive) never collapses but costs the wake-up on every
 * barrier, 4x on the bundled model on an idle machine. shoal's default is a
 * short bounded spin, then sleep (libgomp), or sleep at once (libomp).
 * Thread: main, first thing in main(), before any other thread exists.
 */
#ifndef SHOAL_OMP_ENV_H
#define SHOAL_OMP_ENV_H

/* The values (meson.build, config.h):
 * SHOAL_OMP_GOMP_SPINCOUNT, libgomp (GCC): polls before a waiting thread
 *   sleeps (its default: 300000). Measured on the bundled model
 *   (docs/BENCHMARKS.md): 1000 is within 0-15 % of the best policy idle and
 *   at least half the best beside a CPU hog, where 10000 and more fall
 *   5-30x and the default 50-100x.
 * SHOAL_OMP_KMP_BLOCKTIME, libomp (clang, macOS): milliseconds a waiting
 *   thread spins before it sleeps (its default: 200). 1 ms already
 *   collapses beside a hog like the default; libomp before LLVM 18 knows no
 *   finer unit, so 0: sleep at once. */

/* Set shoal's wait policy unless the user set any of OMP_WAIT_POLICY,
 * GOMP_SPINCOUNT or KMP_BLOCKTIME (then the environment is left as it is,
 * so each stays an override): GOMP_SPINCOUNT and KMP_BLOCKTIME get the
 * values above, overwriting nothing. libomp reads them at its first
 * parallel region, so setting them is enough. libgomp reads its environment
 * when it is loaded, before main(): there the process re-executes itself
 * (the file /proc/self/exe names, same argv, same pid, the variables now
 * set), once; where that fails (no /proc, a foreign-ISA binary under
 * qemu-user without binfmt_misc) it carries on with libgomp's default.
 *   argv  main()'s argv, passed to the re-executed image unchanged.
 * Returns only when the process continues in this image. Call it before
 * anything else in main(): before any OpenMP call, thread, open file or
 * output. Thread: main. */
void shoal_omp_env_init(char **argv);

#endif
