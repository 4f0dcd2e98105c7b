/* The vendor's cmodel (TPU-MLIR's libcmodel) runs each engine of the chip as a thread (CORE_MAIN, TPU_BD,
 * TPU_GDMA, TPU_SORT, TPU_GDE, TPU_NMS) that polls its queue by locking and unlocking a mutex in a loop,
 * never sleeping: seven threads on two cores, most of them waiting on the one engine with work. Loaded with
 * LD_PRELOAD into a process that runs the cmodel (llmbuild/runtime/cmodel_yield.py), this gives up the
 * processor after each unlock in those threads, so the thread with work runs sooner. Only scheduling
 * changes: every instruction simulates as before and the results are the same bits. Other threads, and
 * processes without the cmodel, only pay a name lookup per thread. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/prctl.h>

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
