// thread_pool.c: the persistent worker pool that splits one large call over several cores,
// and the per-call thread count (CUVIL_NUM_THREADS, cuvil_set_threads).
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

static int g_threads = 1;  // worker threads per call (CUVIL_NUM_THREADS, cuvil_set_threads)

int cuvil_set_threads(int n) {
    if (n < 1 || n > CUVIL_MAX_THREADS) return CUVIL_EINVAL;
    g_threads = n;
    return CUVIL_OK;
}
int cuvil_get_threads(void) { return g_threads; }

// Split [0, n) into up to g_threads contiguous ranges of at least min_chunk items; range 0 runs
// on the calling thread, the others on a persistent pool (started on first use, idle workers
// sleep on a condition variable). Every range computes exactly what a single call would, so
// results do not depend on the thread count. When another call holds the pool, or a worker
// cannot be started, the work runs on fewer threads.
typedef struct {
    cuvil_range_fn fn;
    void *ctx;
    size_t begin, end;
} range_job;

static pthread_mutex_t g_pool_owner = PTHREAD_MUTEX_INITIALIZER;  // one parallel_for at a time
static pthread_mutex_t g_pool_mu = PTHREAD_MUTEX_INITIALIZER;     // guards the fields below
static pthread_cond_t g_pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_pool_done = PTHREAD_COND_INITIALIZER;
static size_t g_pool_size;                  // workers started (ids 1..g_pool_size)
static unsigned long g_pool_gen;            // bumped for each batch of jobs
static unsigned long g_pool_seen0[CUVIL_MAX_THREADS];
static range_job g_pool_jobs[CUVIL_MAX_THREADS];
static size_t g_pool_njobs, g_pool_pending;

static void *pool_worker(void *arg) {
    const size_t id = (size_t)(uintptr_t)arg;
    pthread_mutex_lock(&g_pool_mu);
    unsigned long seen = g_pool_seen0[id];  // the generation current when this worker was made
    for (;;) {
        while (g_pool_gen == seen) pthread_cond_wait(&g_pool_wake, &g_pool_mu);
        seen = g_pool_gen;
        if (id < g_pool_njobs) {
            range_job j = g_pool_jobs[id];
            pthread_mutex_unlock(&g_pool_mu);
            j.fn(j.ctx, j.begin, j.end);
            pthread_mutex_lock(&g_pool_mu);
            if (--g_pool_pending == 0) pthread_cond_signal(&g_pool_done);
        }
    }
    return NULL;
}

// A forked child has none of the parent's workers: start over.
static void pool_after_fork_child(void) {
    pthread_mutex_init(&g_pool_owner, NULL);
    pthread_mutex_init(&g_pool_mu, NULL);
    pthread_cond_init(&g_pool_wake, NULL);
    pthread_cond_init(&g_pool_done, NULL);
    g_pool_size = 0;
    g_pool_njobs = g_pool_pending = 0;
}

void cuvil_parallel_for(size_t n, size_t min_chunk, cuvil_range_fn fn, void *ctx) {
    size_t t = (size_t)g_threads;
    if (min_chunk == 0) min_chunk = 1;
    if (t > n / min_chunk) t = n / min_chunk;
    if (t <= 1 || pthread_mutex_trylock(&g_pool_owner) != 0) {
        if (n) fn(ctx, 0, n);
        return;
    }
    while (g_pool_size + 1 < t) {  // gen only changes under g_pool_owner, which we hold
        const size_t id = g_pool_size + 1;
        pthread_t th;
        g_pool_seen0[id] = g_pool_gen;
        if (pthread_create(&th, NULL, pool_worker, (void *)(uintptr_t)id) != 0) break;
        pthread_detach(th);
        g_pool_size = id;
    }
    if (t > g_pool_size + 1) t = g_pool_size + 1;
    range_job first = {fn, ctx, 0, n / t};
    if (t > 1) {
        pthread_mutex_lock(&g_pool_mu);
        for (size_t i = 1; i < t; ++i) {
            g_pool_jobs[i].fn = fn;
            g_pool_jobs[i].ctx = ctx;
            g_pool_jobs[i].begin = n * i / t;
            g_pool_jobs[i].end = n * (i + 1) / t;
        }
        g_pool_njobs = t;
        g_pool_pending = t - 1;
        ++g_pool_gen;
        pthread_cond_broadcast(&g_pool_wake);
        pthread_mutex_unlock(&g_pool_mu);
    } else {
        first.end = n;
    }
    first.fn(first.ctx, first.begin, first.end);
    if (t > 1) {
        pthread_mutex_lock(&g_pool_mu);
        while (g_pool_pending) pthread_cond_wait(&g_pool_done, &g_pool_mu);
        g_pool_njobs = 0;
        pthread_mutex_unlock(&g_pool_mu);
    }
    pthread_mutex_unlock(&g_pool_owner);
}

void cuvil_pool_init(void) {
    pthread_atfork(NULL, NULL, pool_after_fork_child);
    const char *nt = getenv("CUVIL_NUM_THREADS");
    if (nt && atoi(nt) > 0) g_threads = atoi(nt) > CUVIL_MAX_THREADS ? CUVIL_MAX_THREADS : atoi(nt);
}
