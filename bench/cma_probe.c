/* How fast process_vm_readv moves memory from another process, beside memcpy (the single-copy
 * path of the shared-memory transport: COLLECTIX_SHM_SINGLE_COPY, docs/performance.md).
 *   gcc -O2 -o /tmp/cma_probe bench/cma_probe.c && /tmp/cma_probe
 * Forks a child that holds 64 MiB, reads it 5 times in one call, in 1 MiB and in 4 MiB calls. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include <time.h>
#include <sys/wait.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  size_t n=64<<20; char*src=malloc(n); memset(src,1,n);
  int p[2]; pipe(p);
  pid_t c=fork();
  if(c==0){ char x; read(p[0],&x,1); return 0;}
  char*dst=malloc(n); memset(dst,0,n);
  for(int chunk=0; chunk<3; chunk++){
    size_t cs = chunk==0? n : chunk==1? (1<<20) : (4<<20);
    double t0=now(); int it=5;
    for(int i=0;i<it;i++){ for(size_t off=0; off<n; off+=cs){ struct iovec l={dst+off,cs}, r={src+off,cs}; ssize_t k=process_vm_readv(c,&l,1,&r,1,0); if(k<0){perror("readv");return 1;} } }
    double t=now()-t0; printf("readv chunk %zu: %.2f GB/s\n", cs, it*n/t/1e9);
  }
  double t0=now(); for(int i=0;i<5;i++) memcpy(dst,src,n); printf("memcpy: %.2f GB/s\n", 5*n/(now()-t0)/1e9);
  write(p[1],"x",1); wait(0); return 0;}
