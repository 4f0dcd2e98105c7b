/* The vendor's cmodel (TPU-MLIR's libcmodel) runs each engine of the chip as a thread (CORE_MAIN, TPU_BD,
 * TPU_GDMA, TPU_SORT, TPU_GDE, TPU_NMS) that polls its queue by locking and unlocking a mutex in a loop,
 * never sleeping: seven threads on two cores, most of them waiting on the one engine with work. Loaded with
 * LD_PRELOAD into a process that runs the cmodel (llmbuild/runtime/cmodel_yield.py), this gives up the
 * processor after each unlock in those threads, so the thread with work runs sooner. Only scheduling
 * changes: every instruction simulates as before and the results are the same bits. Other threads, and
 * processes without the cmodel, only pay a name lookup per thread.
 *
 * Yielding leaves the waiting engines runnable, so beside another process they still took a share of its
 * core: a single-threaded job next to a 1.5B decode block's check ran at 72% of its speed. The process
 * that loads this library therefore runs ENGINE_NICE steps lower in priority, every thread it starts
 * after with it (the engines and the thread that waits on them alike: an engine below its waiter starves):
 * the other job then ran at 96-99%. The check gives way for it: beside such a job it took 17.0 s against
 * 11.5 s without this library (which left the job 28% of its speed), alone 3.9 s against 9.7 s
 * (benchmarks/cmodel_neighbour.py, medians of three). Alone on the machine, a priority changes nothing. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#define ENGINE_NICE 10

static int (*next_unlock)(pthread_mutex_t *);
static __thread int polling_engine = -1; /* unknown until the thread's first unlock */

int pthread_mutex_unlock(pthread_mutex_t *mutex) {
    if (!next_unlock)
        next_unlock = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_unlock");
    int result = next_unlock(mutex);
    if (polling_engine < 0) {
        char name[17] = {0};
        prctl(PR_GET_NAME, name, 0, 0, 0);
        polling_engine = strncmp(name, "TPU_", 4) == 0 || strcmp(name, "CORE_MAIN") == 0;
    }
    if (polling_engine)
        sched_yield();
    return result;
}

__attribute__((constructor)) static void lower_priority(void) {
    /* Lower than it was, never higher; threads started from here on inherit it. Once per process tree: a
     * program this process executes inherits LD_PRELOAD and the priority, and is not lowered again. */
    if (getenv("LLMBUILD_CMODEL_NICED"))
        return;
    int nice = getpriority(PRIO_PROCESS, 0) + ENGINE_NICE;
    setpriority(PRIO_PROCESS, 0, nice > 19 ? 19 : nice);
    setenv("LLMBUILD_CMODEL_NICED", "1", 1);
}
