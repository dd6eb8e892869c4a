// wgmma_overlap: does an H100/H200 SM overlap register-A wgmma with other warps' ALU work?
//
// The BM 64 role2 (kernels/bf16_wgmma_sm90.cuh) runs six warpgroups per SM, each repeating per
// K32 block: decode (about 30 ALU / FMA-pipe instructions per warp), two register-A
// wgmma m64n64k16 BF16, wait. Its timing probes (docs/DESIGN-NOTES.md) added up as if
// the SM either decoded or multiplied, never both: wgmma alone plus decode alone equals both.
// This tool measures that pattern alone, with no loads and no data dependence on memory:
//   mode `alu`: each warpgroup runs X independent ALU instructions per iteration, nothing else;
//   mode `rs`:  the same X instructions, whose results are the A registers of two wgmma
//               m64n64k16 (A from registers, B from shared memory), then commit and wait;
//   mode `ss`:  the same X instructions kept live beside two wgmma m64n64k16 with both operands
//               in shared memory, then commit and wait;
//   modes `rs-pipe`, `ss-pipe`: the wgmma pair issued first, then the next iteration's X
//               instructions (into a second register set), then the wait: each warpgroup's own
//               ALU work overlaps its own wgmma.
// With W warpgroups per SM (one per CTA), the cycles per iteration of a warpgroup tell which
// resources add: overlapped, rs(X) ~ max(rs(0), alu(X)); serialized, rs(X) ~ rs(0) + alu(X).
//
// Usage: wgmma_overlap [--ctas-per-sm W] [--iters I] [--alu 0,16,32,64]
// Prints one row per mode and X: median cycles per iteration over the CTAs (clock64 inside the
// kernel) and the kernel's time. Needs an sm_90a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/sm90_async.cuh"

namespace {

using gcmoe::kernels::FenceOperand;
using gcmoe::kernels::SmemAddr;
using gcmoe::kernels::SmemDescFromLo;
using gcmoe::kernels::SmemDescSwizzle128Lo;
using gcmoe::kernels::WgmmaBf16Rs;
using gcmoe::kernels::WgmmaCommit;
using gcmoe::kernels::WgmmaFence;
using gcmoe::kernels::WgmmaWait;

enum Mode {
  kAluOnly = 0,
  kRegisterA = 1,
  kSharedA = 2,
  kRegisterAPipelined = 3,
  kSharedAPipelined = 4
};
constexpr const char* kModeNames[] = {"alu", "rs", "ss", "rs-pipe", "ss-pipe"};
constexpr int kOperandBytes = 8192;  // 64 rows x 128 bytes, the 128-byte swizzle's layout
constexpr int kSmemBytes = 1024 + 2 * kOperandBytes;

// D (m64 x 64, FP32) += A (m64 x k16 BF16, shared memory) x B (k16 x 64 BF16, shared memory).
__device__ __forceinline__ void WgmmaBf16Ss64(float (&d)[32], uint64_t a_desc, uint64_t b_desc) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%"
      "24,%25,%26,%27,%28,%29,%30,%31}, "
      "%32, %33, 1, 1, 1, 0, 0;\n"
      : GCMOE_WGMMA_D8(0), GCMOE_WGMMA_D8(1), GCMOE_WGMMA_D8(2), GCMOE_WGMMA_D8(3)
      : "l"(a_desc), "l"(b_desc));
}

// One ALU instruction the compiler must keep: v = v ^ w ^ s (LOP3 on the ALU pipe), or with
// kFma a BF16x2 multiply (the FMA pipe, as the decode's HMUL2).
template <bool kFma>
__device__ __forceinline__ void AluOp(uint32_t& v, uint32_t w, uint32_t s) {
  if constexpr (kFma) {
    asm volatile("mul.rn.bf16x2 %0, %0, %1;" : "+r"(v) : "r"(w));
  } else {
    asm volatile("lop3.b32 %0, %0, %1, %2, 0x96;" : "+r"(v) : "r"(w), "r"(s));
  }
}

// kFmaShare: every how-many-th ALU instruction is an FMA-pipe multiply (0: none).
template <Mode kMode, int kAlu, int kFmaShare>
__global__ void __launch_bounds__(128) OverlapKernel(int iters, long long* cycles, uint32_t* sink) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  for (int i = threadIdx.x; i < 2 * kOperandBytes / 4; i += blockDim.x) {
    reinterpret_cast<uint32_t*>(smem)[i] = 0;
  }
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  __syncthreads();
  const uint32_t a_lo = SmemDescSwizzle128Lo(SmemAddr(smem));
  const uint32_t b_lo = SmemDescSwizzle128Lo(SmemAddr(smem + kOperandBytes));
  float acc[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
  uint32_t v[8];
  uint32_t u[8];  // the pipelined modes' second register set
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = u[i] = 0x3F803F80u + threadIdx.x + i;  // BF16 near 1
  const uint32_t w = 0x3F803F80u;                                           // BF16x2 1.0
  // X ALU instructions over eight independent registers.
  const auto alu = [w](uint32_t(&r)[8], int it) {
#pragma unroll
    for (int j = 0; j < kAlu; ++j) {
      if constexpr (kFmaShare > 0) {
        if (j % kFmaShare == 0) {
          AluOp<true>(r[j % 8], w, 0);
          continue;
        }
      }
      AluOp<false>(r[j % 8], w, static_cast<uint32_t>(it));
    }
  };
  // Two wgmma m64n64k16 (the K32 block's two K16 steps), committed as one group; register-A
  // modes take `r` as the A registers.
  const auto issue = [&acc, a_lo, b_lo](uint32_t(&r)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) FenceOperand(r[i]);
    WgmmaFence();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kMode == kRegisterA || kMode == kRegisterAPipelined) {
        const uint32_t a[4] = {r[4 * h], r[4 * h + 1], r[4 * h + 2], r[4 * h + 3]};
        WgmmaBf16Rs<64>::Run(acc, a, SmemDescFromLo(b_lo + 2 * h));
      } else {
        WgmmaBf16Ss64(acc, SmemDescFromLo(a_lo + 2 * h), SmemDescFromLo(b_lo + 2 * h));
      }
    }
    WgmmaCommit();
  };
  constexpr bool kPipelined = kMode == kRegisterAPipelined || kMode == kSharedAPipelined;
  const long long start = clock64();
  for (int it = 0; it < iters; it += 2) {
    if constexpr (kMode == kAluOnly) {
      alu(v, it);
      alu(v, it + 1);
    } else if constexpr (!kPipelined) {  // ALU, then the wgmma that need it, waited for
      alu(v, it);
      issue(v);
      WgmmaWait<0>();
      alu(v, it + 1);
      issue(v);
      WgmmaWait<0>();
    } else {  // the wgmma issued, the next iteration's ALU work, then the wait
      issue(v);
      alu(u, it);
      WgmmaWait<0>();
      issue(u);
      alu(v, it + 1);
      WgmmaWait<0>();
    }
  }
#pragma unroll
  for (int i = 0; i < 32; ++i) FenceOperand(acc[i]);
  const long long stop = clock64();
  uint32_t out = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) out ^= v[i] ^ u[i];
#pragma unroll
  for (int i = 0; i < 32; ++i) out ^= __float_as_uint(acc[i]);
  sink[blockIdx.x * blockDim.x + threadIdx.x] = out;
  if (threadIdx.x == 0) cycles[blockIdx.x] = stop - start;
}

struct Options {
  int ctas_per_sm = 6;
  int iters = 4000;
  std::vector<int> alu = {0, 16, 32, 48, 64};
};

void Usage() {
  std::printf(
      "usage: wgmma_overlap [--ctas-per-sm W] [--iters I] [--alu X,X,...]\n"
      "  Times W warpgroups per SM (one per CTA, every SM) repeating X independent ALU\n"
      "  instructions per iteration, alone (alu), feeding two register-A wgmma m64n64k16 BF16\n"
      "  (rs), or beside two shared-memory wgmma of that shape (ss); each wgmma pair waited for,\n"
      "  and the same with the next iteration's ALU work between issue and wait (rs-pipe, "
      "ss-pipe).\n"
      "  --ctas-per-sm  warpgroups per SM (default 6, as the BM 64 role2)\n"
      "  --iters        iterations per warpgroup (default 4000, rounded up to even)\n"
      "  --alu          ALU instructions per iteration and warp (default 0,16,32,48,64; each a\n"
      "                 multiple of 16 up to 64)\n");
}

bool ParseList(const char* text, std::vector<int>* out) {
  out->clear();
  std::string s(text);
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string item =
        s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    char* end = nullptr;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < 0 || value > 64 || value % 16 != 0) return false;
    out->push_back(static_cast<int>(value));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return !out->empty();
}

bool ParseInt(const char* text, int lo, int hi, int* out) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < lo || value > hi) return false;
  *out = static_cast<int>(value);
  return true;
}

using KernelFn = void (*)(int, long long*, uint32_t*);

template <Mode kMode, int kFmaShare>
KernelFn Pick(int alu) {
  switch (alu) {
    case 0:
      return OverlapKernel<kMode, 0, kFmaShare>;
    case 16:
      return OverlapKernel<kMode, 16, kFmaShare>;
    case 32:
      return OverlapKernel<kMode, 32, kFmaShare>;
    case 48:
      return OverlapKernel<kMode, 48, kFmaShare>;
    default:
      return OverlapKernel<kMode, 64, kFmaShare>;
  }
}

KernelFn Pick(Mode mode, int alu, bool fma) {
  switch (mode) {
    case kAluOnly:
      return fma ? Pick<kAluOnly, 4>(alu) : Pick<kAluOnly, 0>(alu);
    case kRegisterA:
      return fma ? Pick<kRegisterA, 4>(alu) : Pick<kRegisterA, 0>(alu);
    case kSharedA:
      return fma ? Pick<kSharedA, 4>(alu) : Pick<kSharedA, 0>(alu);
    case kRegisterAPipelined:
      return fma ? Pick<kRegisterAPipelined, 4>(alu) : Pick<kRegisterAPipelined, 0>(alu);
    default:
      return fma ? Pick<kSharedAPipelined, 4>(alu) : Pick<kSharedAPipelined, 0>(alu);
  }
}

#define CHECK_CUDA(call)                                                                       \
  do {                                                                                         \
    const cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "wgmma_overlap: %s failed: %s\n", #call, cudaGetErrorString(err_)); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      Usage();
      return 0;
    } else if (std::strcmp(argv[i], "--ctas-per-sm") == 0 && has_value) {
      if (!ParseInt(argv[++i], 1, 16, &opt.ctas_per_sm)) {
        std::fprintf(stderr, "wgmma_overlap: --ctas-per-sm takes 1..16, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (std::strcmp(argv[i], "--iters") == 0 && has_value) {
      if (!ParseInt(argv[++i], 1, 1 << 24, &opt.iters)) {
        std::fprintf(stderr, "wgmma_overlap: --iters takes 1..16777216, got '%s'\n", argv[i]);
        return 2;
      }
      opt.iters += opt.iters & 1;  // the kernel runs iterations in pairs
    } else if (std::strcmp(argv[i], "--alu") == 0 && has_value) {
      if (!ParseList(argv[++i], &opt.alu)) {
        std::fprintf(stderr, "wgmma_overlap: --alu takes multiples of 16 up to 64, got '%s'\n",
                     argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "wgmma_overlap: unknown or incomplete argument '%s'\n", argv[i]);
      Usage();
      return 2;
    }
  }
  int device = 0;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  if (prop.major != 9) {
    std::fprintf(stderr, "wgmma_overlap: needs an sm_90 GPU, found %s (sm_%d%d)\n", prop.name,
                 prop.major, prop.minor);
    return 1;
  }
  const int grid = prop.multiProcessorCount * opt.ctas_per_sm;
  long long* cycles = nullptr;
  uint32_t* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&cycles, grid * sizeof(long long)));
  CHECK_CUDA(cudaMalloc(&sink, static_cast<size_t>(grid) * 128 * sizeof(uint32_t)));
  cudaEvent_t begin, end;
  CHECK_CUDA(cudaEventCreate(&begin));
  CHECK_CUDA(cudaEventCreate(&end));
  std::printf(
      "# %s, %d SMs, %d warpgroups per SM, %d iterations; cycles per iteration of a "
      "warpgroup (median over CTAs)\n",
      prop.name, prop.multiProcessorCount, opt.ctas_per_sm, opt.iters);
  std::printf("%-7s %-5s %4s %12s %10s\n", "mode", "pipe", "alu", "cycles/iter", "kernel_ms");
  std::vector<long long> host(grid);
  for (bool fma : {false, true}) {
    for (int alu : opt.alu) {
      for (Mode mode : {kAluOnly, kRegisterA, kSharedA, kRegisterAPipelined, kSharedAPipelined}) {
        const KernelFn kernel = Pick(mode, alu, fma);
        CHECK_CUDA(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
        int resident = 0;
        CHECK_CUDA(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, 128, kSmemBytes));
        if (resident < opt.ctas_per_sm) {
          std::fprintf(stderr, "wgmma_overlap: only %d CTAs per SM fit (%s, alu %d)\n", resident,
                       kModeNames[mode], alu);
          return 1;
        }
        kernel<<<grid, 128, kSmemBytes>>>((opt.iters / 10 + 2) & ~1, cycles, sink);  // warm-up
        CHECK_CUDA(cudaGetLastError());
        CHECK_CUDA(cudaEventRecord(begin));
        kernel<<<grid, 128, kSmemBytes>>>(opt.iters, cycles, sink);
        CHECK_CUDA(cudaEventRecord(end));
        CHECK_CUDA(cudaEventSynchronize(end));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, begin, end));
        CHECK_CUDA(
            cudaMemcpy(host.data(), cycles, grid * sizeof(long long), cudaMemcpyDeviceToHost));
        std::sort(host.begin(), host.end());
        std::printf("%-7s %-5s %4d %12.1f %10.3f\n", kModeNames[mode], fma ? "mixed" : "alu", alu,
                    static_cast<double>(host[grid / 2]) / opt.iters, ms);
      }
    }
  }
  CHECK_CUDA(cudaFree(cycles));
  CHECK_CUDA(cudaFree(sink));
  return 0;
}
