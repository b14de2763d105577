/* The driver of cpu-2026-11-28-s14-rowpf-harness.txt (session 14, helper rowpf), kept for reproduction.
   Build: the suite's row kernels as COIL_DEBUG writes them (`COIL_DEBUG=DIR bench --scale 0.05 --only <the five>`,
   DIR/run_*/graph_N/kernels/red_*.c: graph 1 softmax 8192x4096, 4 softmax 1024x65536, 7 layernorm, 10 rmsnorm,
   13 add_layernorm), one file per build and variant with the function renamed <short>_<variant> (sm4k, sm64k, ln, rms,
   aln; base, pf, pf2, pfnt: see the .txt), each `cc -O3 -march=native -ffp-contract=off -fno-math-errno
   -fno-trapping-math -fopenmp-simd -c`, then `cc -O3 -march=native -o h this.c *.o -lpthread -lm`.
   Run: ./h THREADS REPS [NAME-SUBSTRING]. (pfnt was named pf3 in the runs.) */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <immintrin.h>
typedef void (*kfn)(char *const *, int64_t *);
#define DECL(n) void n##_base(char *const *, int64_t *); void n##_pf(char *const *, int64_t *); void n##_pf2(char *const *, int64_t *); void n##_pfnt(char *const *, int64_t *);
DECL(sm4k) DECL(sm64k) DECL(ln) DECL(rms) DECL(aln)
typedef struct { const char *name; kfn f[4]; int nargs; int64_t rows, cols; double bytes_per_elem; } W;
static W ws[] = {
  {"softmax_8192x4096", {sm4k_base, sm4k_pf, sm4k_pf2, sm4k_pfnt}, 2, 8192, 4096, 8},
  {"softmax_1024x65536", {sm64k_base, sm64k_pf, sm64k_pf2, sm64k_pfnt}, 2, 1024, 65536, 8},
  {"layernorm", {ln_base, ln_pf, ln_pf2, ln_pfnt}, 4, 8192, 4096, 4},
  {"rmsnorm", {rms_base, rms_pf, rms_pf2, rms_pfnt}, 3, 8192, 4096, 4},
  {"add_layernorm", {aln_base, aln_pf, aln_pf2, aln_pfnt}, 6, 8192, 4096, 8},
};
#define BIG (1024L*65536*4)
static char *bufs[6]; static int nth; static W *cur; static int var;
static void *worker(void *p) { int64_t t = (int64_t)p; int64_t rg[2] = {cur->rows*t/nth, cur->rows*(t+1)/nth}; int64_t st[4]={0};
  char *args[10]; for (int i=0;i<cur->nargs;i++) args[i]=bufs[i]; args[cur->nargs]=0; args[cur->nargs+1]=0; args[cur->nargs+2]=(char*)rg;
  if (var < 4) cur->f[var](args, st); else { float *a=(float*)bufs[0], *b=(float*)bufs[1]; int64_t n=BIG/4, lo=n*t/nth, hi=n*(t+1)/nth; for(int64_t i=lo;i<hi;i+=16) _mm512_store_ps(b+i,_mm512_load_ps(a+i)); }
  return 0; }
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
static double run(void){ double t0=now(); pthread_t th[8]; pthread_attr_t at; pthread_attr_init(&at); pthread_attr_setstacksize(&at, 8<<20); for(int t=0;t<nth;t++) pthread_create(&th[t],&at,worker,(void*)(int64_t)t); for(int t=0;t<nth;t++) pthread_join(th[t],0); return now()-t0; }
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc, char**argv){ nth = atoi(argv[1]); int reps = atoi(argv[2]);
  for (int i=0;i<6;i++){ bufs[i]=aligned_alloc(64,BIG); uint32_t s=12345+i; uint16_t *f=(uint16_t*)bufs[i]; for(long j=0;j<BIG/2;j++){ s=s*1664525u+1013904223u; float v=((s>>9)&0xffff)/32768.0f-1.0f; uint32_t u; memcpy(&u,&v,4); f[j]=u>>16; } }
  for (unsigned w=0; w<sizeof ws/sizeof *ws; w++) { cur=&ws[w]; if (argc>3 && !strstr(cur->name, argv[3])) continue;
    double ts[5][64]; double gb = cur->rows*cur->cols*cur->bytes_per_elem/1e9;
    for (int v=0; v<4; v++){ var=v; run(); }
    for (int r=0;r<reps;r++) for (int k=0;k<5;k++){ int v=(r+k)%5; var=v; ts[v][r]=run(); }
    printf("%-20s thr=%d", cur->name, nth);
    for (int v=0; v<5; v++){ double g = v<4 ? gb : 2.0*BIG/1e9; qsort(ts[v],reps,sizeof(double),cmp); printf("  %s max %5.1f med %5.1f", v==0?"base":v==1?"pf":v==2?"pf2":v==3?"pfnt":"copy", g/ts[v][0], g/ts[v][reps/2]); }
    printf("  load %s", ""); FILE *l=fopen("/proc/loadavg","r"); char b[64]; fgets(b,64,l); fclose(l); printf("%s", b);
  }
}
