// P2P latency/bandwidth probe of vfio-p2p's benchmark run (guest-agent/bench/h200x2.sh).
//
// A copy of the team's reference probe (../shared/reference/p2p_lat.cu, REFERENCE.md §5)
// with two changes. argv picks the ordered pair: `p2p_lat [SRC DST]` (CUDA ordinals,
// default 0 1); every "0" of the original is SRC and every "1" is DST. And its last line
// prints the device addresses of the two ping-pong flags, after every measurement, to
// compare with the agent's `pingpong_flag_addresses`. The kernels, sizes, iteration
// counts, warm-ups, allocation order and event timing are the original's, so its figures
// stay comparable with the reference results and with the agent's. With no arguments it
// measures exactly what the original measures.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define CK(x) do{cudaError_t er_=(x); if(er_!=cudaSuccess){printf("ERR %s:%d %s\n",__FILE__,__LINE__,cudaGetErrorString(er_)); return 1;}}while(0)
__global__ void ping(volatile int* my, volatile int* peer, int iters){ for(int k=1;k<=iters;k++){ *peer=k; __threadfence_system(); while(*my!=k); } }
__global__ void pong(volatile int* my, volatile int* peer, int iters){ for(int k=1;k<=iters;k++){ while(*my!=k); *peer=k; __threadfence_system(); } }
__global__ void chase(const unsigned* __restrict__ p, int n, unsigned* out){ unsigned x=0; for(int i=0;i<n;i++) x=p[x]; *out=x; }
int main(int argc, char** argv){
  if(argc!=1 && argc!=3){ printf("usage: %s [SRC DST]\n",argv[0]); return 2; }
  const int S=argc==3?atoi(argv[1]):0, D=argc==3?atoi(argv[2]):1;
  int n; CK(cudaGetDeviceCount(&n)); printf("devices %d\n",n);
  for(int i=0;i<n;i++) for(int j=0;j<n;j++) if(i!=j){ int a; cudaDeviceCanAccessPeer(&a,i,j); printf("canAccess %d->%d %d\n",i,j,a);} 
  if(n<2) return 0;
  if(S==D || S<0 || D<0 || S>=n || D>=n){ printf("ERR SRC and DST must be two different devices below %d\n",n); return 2; }
  printf("pair %d->%d\n",S,D);
  CK(cudaSetDevice(S)); CK(cudaDeviceEnablePeerAccess(D,0)); CK(cudaSetDevice(D)); CK(cudaDeviceEnablePeerAccess(S,0));
  int *f0,*f1; CK(cudaSetDevice(S)); CK(cudaMalloc(&f0,4)); CK(cudaMemset(f0,0,4)); CK(cudaSetDevice(D)); CK(cudaMalloc(&f1,4)); CK(cudaMemset(f1,0,4));
  const int IT=100000; cudaEvent_t s,e; CK(cudaSetDevice(S)); cudaEventCreate(&s); cudaEventCreate(&e);
  CK(cudaSetDevice(D)); pong<<<1,1>>>(f1,f0,IT); CK(cudaSetDevice(S)); cudaEventRecord(s); ping<<<1,1>>>(f0,f1,IT); cudaEventRecord(e); CK(cudaEventSynchronize(e)); CK(cudaSetDevice(D)); CK(cudaDeviceSynchronize());
  float ms; cudaEventElapsedTime(&ms,s,e); printf("pingpong one-way latency: %.3f us\n", ms*1e3/IT/2);
  // pointer chase remote read: array on DST, kernel on SRC
  const int N=1<<22; unsigned* h=(unsigned*)malloc(N*4); for(int i=0;i<N;i++) h[i]=(unsigned)(((unsigned long long)i*2654435761ULL+12345)%N); // pseudo-random chain
  unsigned *d1,*d0,*o; CK(cudaSetDevice(D)); CK(cudaMalloc(&d1,N*4)); CK(cudaMemcpy(d1,h,N*4,cudaMemcpyHostToDevice)); CK(cudaSetDevice(S)); CK(cudaMalloc(&d0,N*4)); CK(cudaMemcpy(d0,h,N*4,cudaMemcpyHostToDevice)); CK(cudaMalloc(&o,4));
  int steps=20000; chase<<<1,1>>>(d1,100,o); cudaDeviceSynchronize();
  cudaEventRecord(s); chase<<<1,1>>>(d1,steps,o); cudaEventRecord(e); cudaEventSynchronize(e); cudaEventElapsedTime(&ms,s,e); printf("remote read pointer-chase latency: %.3f us\n", ms*1e3/steps);
  cudaEventRecord(s); chase<<<1,1>>>(d0,steps,o); cudaEventRecord(e); cudaEventSynchronize(e); cudaEventElapsedTime(&ms,s,e); printf("local read pointer-chase latency: %.3f us\n", ms*1e3/steps);
  // memcpy peer latency, small
  int *a0,*a1; cudaMalloc(&a0,4); cudaSetDevice(D); cudaMalloc(&a1,4); cudaSetDevice(S); cudaStream_t st; cudaStreamCreate(&st);
  for(int k=0;k<100;k++) cudaMemcpyPeerAsync(a1,D,a0,S,4,st); cudaStreamSynchronize(st);
  cudaEventRecord(s,st); for(int k=0;k<10000;k++) cudaMemcpyPeerAsync(a1,D,a0,S,4,st); cudaEventRecord(e,st); cudaEventSynchronize(e); cudaEventElapsedTime(&ms,s,e); printf("memcpyPeerAsync 4B per-copy: %.3f us\n", ms*1e3/10000);
  // bandwidth uni + bi
  size_t B=256<<20; char *b0,*b1,*c0,*c1; cudaSetDevice(S); cudaMalloc(&b0,B); cudaMalloc(&c0,B); cudaSetDevice(D); cudaMalloc(&b1,B); cudaMalloc(&c1,B); cudaStream_t st1; cudaStreamCreate(&st1); cudaSetDevice(S);
  cudaEventRecord(s,st); for(int k=0;k<20;k++) cudaMemcpyPeerAsync(b1,D,b0,S,B,st); cudaEventRecord(e,st); cudaEventSynchronize(e); cudaEventElapsedTime(&ms,s,e); printf("uni bw %d->%d: %.1f GB/s\n", S, D, 20.0*B/(ms/1e3)/1e9);
  cudaEventRecord(s,st); for(int k=0;k<20;k++){ cudaMemcpyPeerAsync(b1,D,b0,S,B,st); cudaMemcpyPeerAsync(c0,S,c1,D,B,st1);} cudaStreamSynchronize(st1); cudaEventRecord(e,st); cudaEventSynchronize(e); cudaEventElapsedTime(&ms,s,e); printf("bidir bw: %.1f GB/s\n", 40.0*B/(ms/1e3)/1e9);
  // disabled peer: staged
  cudaSetDevice(S); cudaDeviceDisablePeerAccess(D); cudaSetDevice(D); cudaDeviceDisablePeerAccess(S); cudaSetDevice(S);
  cudaEventRecord(s,st); for(int k=0;k<10;k++) cudaMemcpyPeerAsync(b1,D,b0,S,B,st); cudaEventRecord(e,st); cudaEventSynchronize(e); cudaEventElapsedTime(&ms,s,e); printf("uni bw %d->%d peer disabled: %.1f GB/s\n", S, D, 10.0*B/(ms/1e3)/1e9);
  cudaEventRecord(s,st); for(int k=0;k<10000;k++) cudaMemcpyPeerAsync(a1,D,a0,S,4,st); cudaEventRecord(e,st); cudaEventSynchronize(e); cudaEventElapsedTime(&ms,s,e); printf("memcpyPeerAsync 4B per-copy peer disabled: %.3f us\n", ms*1e3/10000);
  printf("pingpong flag addresses: %p %p\n", (void*)f0, (void*)f1);
  return 0; }
