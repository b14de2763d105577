/* The driver of cpu-2026-11-28-s16-ntstore-harness.txt (session 16, helper ntstore), after session 14's
   (cpu-2026-11-28-s14-rowpf-harness.c). Build: the suite's row kernels as COIL_DEBUG writes them at scale 1
   (`COIL_DEBUG=DIR bench --scale 1 --only softmax_f32_8192x4096,softmax_f32_1024x65536,layernorm_bf16_8192x4096,
   rmsnorm_bf16_8192x4096,add_layernorm_bf16_8192x4096`: graph 1 sm4k, 4 sm64k, 7 ln, 10 rms, 13 aln), base = main's
   bench, nt = this branch's; ntf = nt forced where the rule says no (ln, rms: the last pass's bf16 row through a block
   buffer and coil_stream_store, as the branch emits for f32 rows) or the streamed pass without the next row's
   prefetches (aln: what the branch emitted before it let a streamed pass take them); for sm4k and sm64k ntf is nt again. Each file compiled as the runtime
   compiles (cc -O3 -march=native -ffp-contract=off -fno-math-errno -fno-trapping-math -fopenmp-simd -c) with
   -D<kernel>=<short>_<variant>, then `cc -O3 -march=native -o h harness.c *.o -lpthread -lm`.
   Run: ./h THREADS REPS [NAME-SUBSTRING]; ./h THREADS 0 runs each variant once and compares its outputs with base's
   byte for byte (inputs refilled before each workload: random bf16 in [-1, 1), no NaNs). */
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <immintrin.h>
typedef void (*kfn)(char *const *, int64_t *);
#define NV 3
#define DECL(n) void n##_base(char *const *, int64_t *); void n##_nt(char *const *, int64_t *); void n##_ntf(char *const *, int64_t *);
DECL(sm4k) DECL(sm64k) DECL(ln) DECL(rms) DECL(aln)
static const char *vname[] = {"base", "nt", "ntf", "copy"};
typedef struct { const char *name; kfn f[NV]; int nargs; int64_t rows, cols; double bytes_per_elem; } W;
static W ws[] = {
  {"softmax_8192x4096", {sm4k_base, sm4k_nt, sm4k_ntf}, 2, 8192, 4096, 8},
  {"softmax_1024x65536", {sm64k_base, sm64k_nt, sm64k_ntf}, 2, 1024, 65536, 8},
  {"layernorm", {ln_base, ln_nt, ln_ntf}, 4, 8192, 4096, 4},
  {"rmsnorm", {rms_base, rms_nt, rms_ntf}, 3, 8192, 4096, 4},
  {"add_layernorm", {aln_base, aln_nt, aln_ntf}, 6, 8192, 4096, 8},
};
#define BIG (1024L*65536*4)
static char *bufs[6]; static int nth; static W *cur; static int var;
static void *worker(void *p) { int64_t t = (int64_t)p; int64_t rg[2] = {cur->rows*t/nth, cur->rows*(t+1)/nth}; int64_t st[4]={0};
  char *args[10]; for (int i=0;i<cur->nargs;i++) args[i]=bufs[i]; args[cur->nargs]=0; args[cur->nargs+1]=0; args[cur->nargs+2]=(char*)rg;
  if (var < NV) cur->f[var](args, st); else { float *a=(float*)bufs[0], *b=(float*)bufs[1]; int64_t n=BIG/4, lo=n*t/nth, hi=n*(t+1)/nth; for(int64_t i=lo;i<hi;i+=16) _mm512_storeu_ps(b+i,_mm512_loadu_ps(a+i)); }
  return 0; }
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
static double run(void){ double t0=now(); pthread_t th[8]; pthread_attr_t at; pthread_attr_init(&at); pthread_attr_setstacksize(&at, 8<<20); for(int t=0;t<nth;t++) pthread_create(&th[t],&at,worker,(void*)(int64_t)t); for(int t=0;t<nth;t++) pthread_join(th[t],0); return now()-t0; }
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static void load(char *b){ FILE *l=fopen("/proc/loadavg","r"); if(!fgets(b,64,l)) b[0]=0; fclose(l); b[strcspn(b,"\n")]=0; }
/* every buffer: bf16 values in [-1, 1) (an f32 is two of them) */
static void fill(void){ for (int i=0;i<6;i++){ uint32_t s=12345+i; uint16_t *f=(uint16_t*)bufs[i]; for(long j=0;j<BIG/2;j++){ s=s*1664525u+1013904223u; float v=((s>>9)&0xffff)/32768.0f-1.0f; uint32_t u; memcpy(&u,&v,4); f[j]=u>>16; } } }
static const int outs[] = {1<<1, 1<<1, 1<<3, 1<<2, 1<<2|1<<5}; /* the kernels' written args */
/* reps 0: every variant once per workload, its buffers compared byte for byte with base's */
static int check(void){ int bad=0; char *ref[6]; for(int i=0;i<6;i++) ref[i]=malloc(BIG);
  for (unsigned w=0; w<sizeof ws/sizeof *ws; w++) { cur=&ws[w]; fill(); /* no NaNs from an earlier kernel's output */
    for (int v=0; v<NV; v++){ for(int i=0;i<cur->nargs;i++) if(outs[w]>>i&1) memset(bufs[i],v?0xa5:0x5a,BIG); var=v; run();
      if (v==0) for(int i=0;i<6;i++) memcpy(ref[i],bufs[i],BIG);
      else for(int i=0;i<6;i++) if (memcmp(ref[i],bufs[i],(outs[w]>>i&1) ? cur->rows*cur->cols*(w<2?4:2) : BIG)) { long n=(outs[w]>>i&1) ? cur->rows*cur->cols*(w<2?4:2) : BIG, j=0, c=0, first=-1; for(;j<n;j++) if(ref[i][j]!=bufs[i][j]){c++; if(first<0) first=j;} printf("%s %s: buffer %d differs from base: %ld bytes, first at %ld (row %ld): %02x vs %02x\n", cur->name, vname[v], i, c, first, first/(cur->cols*2), (unsigned char)ref[i][first], (unsigned char)bufs[i][first]); { uint16_t a,b2; long o=first&~1L; memcpy(&a,ref[i]+o,2); memcpy(&b2,bufs[i]+o,2); long nn=0; for(long q=0;q<n;q+=2){ uint16_t p,r2; memcpy(&p,ref[i]+q,2); memcpy(&r2,bufs[i]+q,2); if(p!=r2 && !((p&0x7fff)>0x7f80 && (r2&0x7fff)>0x7f80)) nn++; } printf("  as bf16 %04x vs %04x; elements differing other than NaN vs NaN: %ld\n", a, b2, nn); } bad=1; } }
    printf("%s: checked\n", cur->name); }
  return bad; }
int main(int argc, char**argv){ nth = atoi(argv[1]); int reps = atoi(argv[2]); if (reps > 64) reps = 64;
  /* OFFSET=16: every buffer 16 bytes past a line, as glibc's malloc returns a large (mmap) block and the runtime's
     outputs are such Vec allocations */
  long off = getenv("OFFSET") ? atol(getenv("OFFSET")) : 0;
  for (int i=0;i<6;i++) bufs[i]=(char*)aligned_alloc(64,BIG+64)+off;
  fill();
  if (reps == 0) return check();
  for (unsigned w=0; w<sizeof ws/sizeof *ws; w++) { cur=&ws[w]; if (argc>3 && !strstr(cur->name, argv[3])) continue; fill();
    double ts[NV+1][64]; double gb = cur->rows*cur->cols*cur->bytes_per_elem/1e9; char l0[64], l1[64]; load(l0);
    for (int v=0; v<NV; v++){ var=v; run(); }
    /* warm (WARM=1 in the environment): each variant runs 3 times in a row and the third is timed, as the suite's
       bench repeats one kernel (its rows stay in a last-level cache large enough for them); else once in rotation */
    int warm = getenv("WARM") && atoi(getenv("WARM"));
    for (int r=0;r<reps;r++) for (int k=0;k<NV+1;k++){ int v=(r+k)%(NV+1); var=v; if (warm) { run(); run(); } ts[v][r]=run(); }
    load(l1); double c = 2.0*BIG/1e9; qsort(ts[NV],reps,sizeof(double),cmp); double cmax = c/ts[NV][0], cmed = c/ts[NV][reps/2];
    printf("%-19s thr=%d", cur->name, nth);
    for (int v=0; v<NV; v++){ qsort(ts[v],reps,sizeof(double),cmp); double mx=gb/ts[v][0], md=gb/ts[v][reps/2];
      printf("  %s %5.1f/%5.1f (%3.0f%%/%3.0f%%)", vname[v], mx, md, 100*mx/cmax, 100*md/cmed); }
    printf("  copy %5.1f/%5.1f  load %.14s -> %.14s\n", cmax, cmed, l0, l1); fflush(stdout);
  }
}
