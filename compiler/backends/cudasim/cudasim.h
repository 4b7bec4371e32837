// The CUDA simulator's shim: what NVRTC provides as builtins, for the host C++ compiler.
//
// The simulator compiles the CUDA rendering of a module (the very source NVRTC gets) with this
// header force-included, so prelude.h takes its CUDA branch (SP_CUDA) and the entry points keep
// their grid-stride loops. Threads run one after another; a thread's index lives in thread_local
// copies of threadIdx/blockIdx, set by sp_sim::run before each call. Nothing our kernels use needs
// two threads at once (no __syncthreads, no shared memory, no warp intrinsics): the sequential run
// is one of the schedules a GPU may pick, and `seed` shuffles blocks and threads to try others.
#pragma once
#define SP_CUDA_SIM 1

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct sp_sim_dim3 { unsigned x, y, z; };
static thread_local sp_sim_dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace sp_sim {
struct trap {};         // what __trap() throws: the launch fails, as a GPU kernel's trap does
}
[[noreturn]] inline void __trap() { throw sp_sim::trap{}; }

// Atomics: threads never overlap in the simulator, but the host may run two launches on two
// Python threads, so the builtins still go through the host's atomics.
template <typename T> inline T atomicCAS(T* p, T expected, T desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected; }
template <typename T, typename F> inline T sp_sim_update(T* p, T v, F f) {
    T old, next;
    __atomic_load(p, &old, __ATOMIC_SEQ_CST);
    do { next = f(old, v); } while (!__atomic_compare_exchange(p, &old, &next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
    return old; }
template <typename T> inline T atomicAdd(T* p, T v) { return sp_sim_update(p, v, [](T a, T b) { return T(a + b); }); }
template <typename T> inline T atomicMin(T* p, T v) { return sp_sim_update(p, v, [](T a, T b) { return b < a ? b : a; }); }
template <typename T> inline T atomicMax(T* p, T v) { return sp_sim_update(p, v, [](T a, T b) { return a < b ? b : a; }); }

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }

namespace sp_sim {

// A permutation of 0..n-1 drawn from `seed` (identity for seed 0): the order blocks, or the
// threads of a block, run in.
inline void order(unsigned* out, unsigned n, uint64_t seed) {
    for (unsigned i = 0; i < n; ++i) out[i] = i;
    if (!seed) return;
    for (unsigned i = n; i > 1; --i) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        unsigned j = (unsigned)((seed >> 33) % i);
        unsigned t = out[i - 1]; out[i - 1] = out[j]; out[j] = t;
    }
}

inline sp_sim_dim3 unflatten(unsigned i, const unsigned* d) { return {i % d[0], (i / d[0]) % d[1], i / (d[0] * d[1])}; }

// The driver copied the parameters into `params` (one pointer per parameter, as cuLaunchKernel
// takes them); each thread gets its own by-value copy, as on a GPU.
template <typename... P, size_t... I>
inline void call(void (*f)(P...), void** params, std::index_sequence<I...>) {
    f(*static_cast<std::remove_cv_t<std::remove_reference_t<P>>*>(params[I])...);
}

template <typename... P>
int run(void (*f)(P...), const unsigned* grid, const unsigned* block, void** params, uint64_t seed) {
    gridDim = {grid[0], grid[1], grid[2]};
    blockDim = {block[0], block[1], block[2]};
    const unsigned blocks = grid[0] * grid[1] * grid[2], threads = block[0] * block[1] * block[2];
    unsigned* block_order = new unsigned[blocks];
    unsigned* thread_order = new unsigned[threads];
    int failed = 0;
    order(block_order, blocks, seed);
    try {
        for (unsigned b = 0; b < blocks; ++b) {
            blockIdx = unflatten(block_order[b], grid);
            order(thread_order, threads, seed ? seed + b + 1 : 0);
            for (unsigned t = 0; t < threads; ++t) {
                threadIdx = unflatten(thread_order[t], block);
                call(f, params, std::index_sequence_for<P...>{});
            }
        }
    } catch (const trap&) {
        failed = 1;
    }
    delete[] block_order;
    delete[] thread_order;
    return failed;
}

// Sizes of the parameters, so the driver can copy them at launch (and into captured graphs).
template <typename... P>
int sizes(void (*)(P...), unsigned long long* out) {
    const unsigned long long s[] = {sizeof(std::remove_cv_t<std::remove_reference_t<P>>)..., 0};
    for (size_t i = 0; i < sizeof...(P); ++i) out[i] = s[i];
    return (int)sizeof...(P);
}

}  // namespace sp_sim

#define SP_SIM_ENTRY(NAME)                                                                             \
    extern "C" int NAME##__sim(const unsigned* g, const unsigned* b, void** p, unsigned long long seed) { \
        return sp_sim::run(NAME, g, b, p, seed); }                                                     \
    extern "C" int NAME##__sim_sizes(unsigned long long* out) { return sp_sim::sizes(NAME, out); }
#define SP_SIM_GLOBAL(NAME) extern "C" const unsigned long long NAME##__sim_size = sizeof(NAME);
