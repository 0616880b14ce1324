/* How long a cache line takes between this machine's two cores, the floor under any small
 * collective over shared memory (docs/performance.md, "The board's quick path").
 *
 *   gcc -O2 -pthread bench/peers/line_pingpong.c -o /tmp/line_pingpong && /tmp/line_pingpong
 *
 * Two threads pinned to cores 0 and 1 run a barrier of flags: each stores its round number in
 * its own line (seven payload words, then the flag, as a board slot is written) and spins
 * until the other's line has the same round. Prints nanoseconds per round. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 2000000
#define DEPTH 32

typedef struct {
    _Alignas(64) _Atomic long w[8];
} line;

static line lanes[2][DEPTH];

static void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    if (sched_setaffinity(0, sizeof s, &s) != 0) perror("sched_setaffinity");
}

static void run(int me) {
    line *mine = lanes[me], *other = lanes[1 - me];
    for (long i = 1; i <= ROUNDS; i++) {
        line *m = &mine[i % DEPTH], *o = &other[i % DEPTH];
        for (int k = 1; k < 8; k++) atomic_store_explicit(&m->w[k], i, memory_order_release);
        atomic_store_explicit(&m->w[0], i, memory_order_release);
        while (atomic_load_explicit(&o->w[0], memory_order_acquire) != i) __builtin_ia32_pause();
        long sum = 0;
        for (int k = 1; k < 8; k++) sum += atomic_load_explicit(&o->w[k], memory_order_acquire);
        if (sum != 7 * i) abort();
    }
}

static void *peer(void *arg) {
    (void)arg;
    pin(1);
    run(1);
    return NULL;
}

int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, peer, NULL);
    pin(0);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    run(0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ROUNDS;
    printf("flag barrier of two pinned threads: %.1f ns per round\n", ns);
    return 0;
}
