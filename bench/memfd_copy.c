// memcpy between two mappings of a memfd (4 KiB pages unless the kernel gives shmem huge
// pages) against anonymous memory with huge pages advised: what one copy out of a peer's
// shared heap can reach on this host. Usage: gcc -O2 -o memfd_copy bench/memfd_copy.c &&
// ./memfd_copy MIB USE_MEMFD (0: anonymous, 1: memfd); run two at once (taskset -c 0 / 1)
// for both cores copying together (docs/performance.md, "In-place all_gather").
#define _GNU_SOURCE
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static char* mem(size_t n,int fd){ if(fd<0){char*p=aligned_alloc(1<<21,n);madvise(p,n,MADV_HUGEPAGE);memset(p,1,n);return p;} int f=memfd_create("x",0); ftruncate(f,n); char*p=mmap(0,n,PROT_READ|PROT_WRITE,MAP_SHARED,f,0); memset(p,1,n); return p;}
int main(int c,char**v){ size_t n=(size_t)atoi(v[1])<<20; int mf=atoi(v[2]); char*s=mem(n,mf?0:-1),*d=mem(n,mf?0:-1); double best=1e9; for(int i=0;i<30;i++){double t=now();memcpy(d,s,n);t=now()-t;if(t<best)best=t;} printf("%s %.2f GB/s (%.2f ms)\n",mf?"memfd":"anon-thp",n/best/1e9,best*1e3);}
