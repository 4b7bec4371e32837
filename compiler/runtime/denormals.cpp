// Subnormal floats on the CPU: flush results to zero (FTZ) and read subnormal inputs as zero (DAZ),
// or not. The modes live in each thread's control register (MXCSR on x86-64, FPCR on AArch64): the
// calling thread and every thread of OpenMP's pool set theirs; threads created later inherit the
// creating thread's (POSIX).
#include <cstdint>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
static int set_mode(int flush) {
    const unsigned bits = 0x8040;     // FTZ (bit 15) and DAZ (bit 6)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(flush ? (csr | bits) : (csr & ~bits));
    return (csr & bits) == bits;
}
static const int supported = 1;
#elif defined(__aarch64__)
static int set_mode(int flush) {
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    const uint64_t bit = 1ull << 24;   // FZ: subnormal inputs and results are zero
    const uint64_t next = flush ? (fpcr | bit) : (fpcr & ~bit);
    __asm__ volatile("msr fpcr, %0" : : "r"(next));
    return (fpcr & bit) != 0;
}
static const int supported = 1;
#else
static int set_mode(int) { return 0; }
static const int supported = 0;
#endif

// Sets the mode everywhere kernels run; returns the calling thread's previous mode, or -1 where the
// CPU has no such mode.
extern "C" int sp_set_flush_denormal(int flush) {
    if (!supported) return -1;
    const int previous = set_mode(flush);
    #pragma omp parallel
    set_mode(flush);
    return previous;
}
