/* How fast process_vm_readv moves memory from another process, beside memcpy, on 4 KiB pages
 * and on transparent huge pages (the single copy of the shared-memory transport:
 * COLLECTIX_SHM_SINGLE_COPY, docs/performance.md, "Huge pages and one copy for rooted calls").
 *   gcc -O2 -o /tmp/cma_probe bench/cma_probe.c && /tmp/cma_probe
 * Each buffer is 64 MiB, allocated and written by the process that owns it (after the fork:
 * no copy-on-write pages shared between the two, which the kernel would unshare on the
 * first pin). For 4 KiB and huge pages, and 64 MiB and 4 MiB calls: the parent reads the
 * child's buffer alone, then while the child reads the parent's at the same time (the two
 * directions of an exchange). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define N ((size_t)64 << 20)
#define HUGE ((size_t)2 << 20)
#define ROUNDS 10

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* 64 MiB, 2 MiB-aligned, advised huge if asked, written once. */
static char *buffer(int huge) {
  char *a = mmap(0, N + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) { perror("mmap"); exit(1); }
  a = (char *)(((size_t)a + HUGE - 1) & ~(HUGE - 1));
  if (huge) madvise(a, N, MADV_HUGEPAGE);
  memset(a, 1, N);
  return a;
}

static int readall(pid_t pid, char *dst, char *src, size_t chunk) {
  for (size_t off = 0; off < N; off += chunk) {
    struct iovec l = {dst + off, chunk}, r = {src + off, chunk};
    if (process_vm_readv(pid, &l, 1, &r, 1, 0) < 0) { perror("process_vm_readv"); return -1; }
  }
  return 0;
}

/* One case in a fresh pair of processes. */
static void run(int huge, size_t chunk, int both) {
  int to_child[2], to_parent[2];
  if (pipe(to_child) || pipe(to_parent)) { perror("pipe"); exit(1); }
  pid_t parent = getpid();
  pid_t child = fork();
  char *src = buffer(huge), *dst = buffer(huge), *peer, go;
  if (child == 0) {
    write(to_parent[1], &src, sizeof src);
    read(to_child[0], &peer, sizeof peer);
    read(to_child[0], &go, 1);
    if (both)
      for (int i = 0; i < ROUNDS; i++) readall(parent, dst, peer, chunk);
    read(to_child[0], &go, 1);
    _exit(0);
  }
  write(to_child[1], &src, sizeof src);
  read(to_parent[0], &peer, sizeof peer);
  write(to_child[1], "g", 1);
  double t = now();
  for (int i = 0; i < ROUNDS; i++)
    if (readall(child, dst, peer, chunk)) break;
  t = now() - t;
  write(to_child[1], "e", 1);
  waitpid(child, 0, 0);
  printf("process_vm_readv, %s pages, %2zu MiB calls, %s: %.2f GB/s\n", huge ? "huge" : "4 KiB",
         chunk >> 20, both ? "the other reading at once" : "alone            ",
         ROUNDS * N / t / 1e9);
  close(to_child[0]); close(to_child[1]); close(to_parent[0]); close(to_parent[1]);
}

int main(void) {
  for (int huge = 0; huge < 2; huge++) {
    char *a = buffer(huge), *b = buffer(huge);
    double t = now();
    for (int i = 0; i < ROUNDS; i++) memcpy(b, a, N);
    printf("memcpy,           %s pages:                                  %.2f GB/s\n",
           huge ? "huge" : "4 KiB", ROUNDS * N / (now() - t) / 1e9);
    munmap(a, N); munmap(b, N);
    for (size_t chunk = N; chunk >= ((size_t)4 << 20); chunk /= 16)
      for (int both = 0; both < 2; both++) run(huge, chunk, both);
  }
  return 0;
}
