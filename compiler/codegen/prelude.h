// The runtime every generated kernel module includes, for both targets. Self-contained: NVRTC has
// no standard headers, so the CUDA side uses only compiler builtins. Types live at global scope;
// functions live in namespace sp and generated code calls them qualified (sp::sin), which keeps
// them apart from the C library's overloads.
#pragma once

#if defined(__CUDACC_RTC__) || defined(__CUDACC__) || defined(SP_CUDA_SIM)
#define SP_CUDA 1
#define SP_FUNC __device__ __forceinline__
#define SP_MEMBER __device__ __forceinline__
#ifndef SP_CUDA_SIM              // the CUDA simulator's shim (backends/cudasim) brings the host's headers
typedef signed char int8_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
extern "C" __device__ int printf(const char*, ...);
#endif
#define SP_MEMCPY memcpy         // a device builtin under NVRTC, no header needed
#else
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif
#define SP_FUNC static inline
#define SP_MEMBER inline
#define SP_MEMCPY __builtin_memcpy
// Before a loop whose iterations touch no memory another iteration writes (a gather form's threads:
// each writes its own elements, the launch's inputs and scratch are only read): vectorise without
// run-time alias tests, whose number (one per pair of streams) passes the compiler's limit in a
// kernel with many arrays (a coefficient table read at constant indices added 35).
#if defined(__clang__)
#define SP_INDEPENDENT _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define SP_INDEPENDENT _Pragma("GCC ivdep")
#else
#define SP_INDEPENDENT
#endif
// Before such a loop that runs a few threads (a row's ends, the bands beside a settled middle: a
// stencil radius of them, four at 8th order): eight lanes a vector, whose epilogue of four runs
// them in one (a loop vectorised for the widest vectors runs fewer threads than its epilogue's lanes
// one at a time). 3-D 64^3 8th-order wave adjoint: 597 -> 468 us in float32, 740 -> 684 in float64;
// 2-D 512^2: 188 -> 147 (codegen/cpu_loops.py, SHORT_RUN_THREADS).
#if defined(_OPENMP) && (defined(__clang__) || defined(__GNUC__))
#define SP_SHORT_RUN _Pragma("omp simd simdlen(8)")
#else
#define SP_SHORT_RUN SP_INDEPENDENT
#endif
#endif

template <int N, typename T>
struct vec_t {
    T c[N];
    SP_MEMBER vec_t() : c{} {}
    SP_MEMBER explicit vec_t(T s) { for (int i = 0; i < N; ++i) c[i] = s; }
    template <typename... A>
    SP_MEMBER vec_t(T a0, T a1, A... rest) : c{a0, a1, T(rest)...} {}
    SP_MEMBER T& operator[](int i) { return c[i]; }
    SP_MEMBER const T& operator[](int i) const { return c[i]; }
};

template <int R, int C, typename T>
struct mat_t {
    vec_t<C, T> r[R];
    SP_MEMBER mat_t() : r{} {}
    SP_MEMBER explicit mat_t(T s) { for (int i = 0; i < R; ++i) r[i] = vec_t<C, T>(s); }
    template <typename... A>
    SP_MEMBER mat_t(T a0, T a1, A... rest) {
        T v[R * C] = {a0, a1, T(rest)...};
        for (int i = 0; i < R; ++i)
            for (int j = 0; j < C; ++j) r[i][j] = v[i * C + j];
    }
    template <typename... A>
    SP_MEMBER mat_t(const vec_t<C, T>& r0, const A&... rest) : r{r0, rest...} {}
    SP_MEMBER vec_t<C, T>& operator[](int i) { return r[i]; }
    SP_MEMBER const vec_t<C, T>& operator[](int i) const { return r[i]; }
};

template <typename T>
struct array_t {
    T* data;
    int64_t shape[4];
    int64_t strides[4];   // bytes
};

struct launch_t {
    int64_t n;
    int64_t dim[4];
    // The threads this call runs, as flat indices [first, end): the whole launch (0, n), or whole
    // rows of its first axis when a launch runs in parts (launch_in_parts in runtime/launch.py).
    int64_t first, end;
    // A GPU launch that logs its adds (serial flag 2): each chunk's partials, in device memory (see
    // sp::add_slot); null everywhere else.
    void* adds;
    int64_t add_slots;
};

namespace sp {

// An adjoint's launch: the forward's, or where the gradient buffer's header carries dims (a gather
// form over arrays wider than the launch, compiler/passes/gather.py), that wider index space.
SP_FUNC launch_t widened(const launch_t& forward, const launch_t& adjoint_header) {
    launch_t L = forward;
    if (adjoint_header.dim[0]) {
        L.n = 1;
        for (int k = 0; k < 4; ++k) { L.dim[k] = adjoint_header.dim[k]; L.n *= L.dim[k]; }
        L.first = 0;
        L.end = L.n;
    }
    return L;
}

// ---- elementwise helpers over vectors and matrices -------------------------------------------
#define SP_MAP2(NAME, EXPR)                                                                          \
    template <int N, typename T>                                                                     \
    SP_FUNC vec_t<N, T> NAME(const vec_t<N, T>& a, const vec_t<N, T>& b) {                          \
        vec_t<N, T> o; for (int i = 0; i < N; ++i) o[i] = NAME(a[i], b[i]); return o; }             \
    template <int R, int C, typename T>                                                              \
    SP_FUNC mat_t<R, C, T> NAME(const mat_t<R, C, T>& a, const mat_t<R, C, T>& b) {                 \
        mat_t<R, C, T> o; for (int i = 0; i < R; ++i) o[i] = NAME(a[i], b[i]); return o; }
#define SP_MAP1(NAME)                                                                                \
    template <int N, typename T>                                                                     \
    SP_FUNC vec_t<N, T> NAME(const vec_t<N, T>& a) {                                                \
        vec_t<N, T> o; for (int i = 0; i < N; ++i) o[i] = NAME(a[i]); return o; }                   \
    template <int R, int C, typename T>                                                              \
    SP_FUNC mat_t<R, C, T> NAME(const mat_t<R, C, T>& a) {                                          \
        mat_t<R, C, T> o; for (int i = 0; i < R; ++i) o[i] = NAME(a[i]); return o; }

template <typename T> SP_FUNC T add(T a, T b) { return a + b; }
template <typename T> SP_FUNC T sub(T a, T b) { return a - b; }
template <typename T> SP_FUNC T neg(T a) { return -a; }
template <typename T> SP_FUNC T cw_mul(T a, T b) { return a * b; }
template <typename T> SP_FUNC T cw_div(T a, T b) { return a / b; }
SP_MAP2(add, 0) SP_MAP2(sub, 0) SP_MAP2(cw_mul, 0) SP_MAP2(cw_div, 0) SP_MAP1(neg)

// Scalar products are spelled out per type: a `template <typename T> mul(T, T)` would be as good a
// match as the square matrix product below, and the call would be ambiguous.
#define SP_SCALAR_MULDIV(T) SP_FUNC T mul(T a, T b) { return a * b; } SP_FUNC T div(T a, T b) { return a / b; }
SP_SCALAR_MULDIV(float) SP_SCALAR_MULDIV(double) SP_SCALAR_MULDIV(int32_t) SP_SCALAR_MULDIV(int64_t)
template <int N, typename T> SP_FUNC vec_t<N, T> mul(T s, const vec_t<N, T>& v) {
    vec_t<N, T> o; for (int i = 0; i < N; ++i) o[i] = s * v[i]; return o; }
template <int N, typename T> SP_FUNC vec_t<N, T> mul(const vec_t<N, T>& v, T s) {
    vec_t<N, T> o; for (int i = 0; i < N; ++i) o[i] = v[i] * s; return o; }
template <int N, typename T> SP_FUNC vec_t<N, T> div(const vec_t<N, T>& v, T s) {
    vec_t<N, T> o; for (int i = 0; i < N; ++i) o[i] = v[i] / s; return o; }
template <int R, int C, typename T> SP_FUNC mat_t<R, C, T> mul(T s, const mat_t<R, C, T>& m) {
    mat_t<R, C, T> o; for (int i = 0; i < R; ++i) o[i] = mul(s, m[i]); return o; }
template <int R, int C, typename T> SP_FUNC mat_t<R, C, T> mul(const mat_t<R, C, T>& m, T s) {
    mat_t<R, C, T> o; for (int i = 0; i < R; ++i) o[i] = mul(m[i], s); return o; }
template <int R, int C, typename T> SP_FUNC mat_t<R, C, T> div(const mat_t<R, C, T>& m, T s) {
    mat_t<R, C, T> o; for (int i = 0; i < R; ++i) o[i] = div(m[i], s); return o; }
template <int R, int C, typename T> SP_FUNC vec_t<R, T> mul(const mat_t<R, C, T>& m, const vec_t<C, T>& v) {
    vec_t<R, T> o;
    for (int i = 0; i < R; ++i) { T s = T(0); for (int j = 0; j < C; ++j) s += m[i][j] * v[j]; o[i] = s; }
    return o; }
template <int R, int C, typename T> SP_FUNC vec_t<C, T> mul(const vec_t<R, T>& v, const mat_t<R, C, T>& m) {
    vec_t<C, T> o;
    for (int j = 0; j < C; ++j) { T s = T(0); for (int i = 0; i < R; ++i) s += v[i] * m[i][j]; o[j] = s; }
    return o; }
template <int R, int K, int C, typename T>
SP_FUNC mat_t<R, C, T> mul(const mat_t<R, K, T>& a, const mat_t<K, C, T>& b) {
    mat_t<R, C, T> o;
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < C; ++j) { T s = T(0); for (int k = 0; k < K; ++k) s += a[i][k] * b[k][j]; o[i][j] = s; }
    return o; }

// Python semantics for // and % (floor division); integer division by zero gives 0 instead of a trap,
// and the one quotient that does not fit, MIN // -1, wraps to MIN as in NumPy (x86 traps on it).
#define SP_INT_FLOORDIV(T, U)                                                                         \
    SP_FUNC T floordiv(T a, T b) {                                                                   \
        if (b == 0) return 0;                                                                        \
        if (b == -1) return (T)(U(0) - (U)a);                                                        \
        T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) --q; return q;                       \
    }
// A periodic index is at most one period off its range ((i + 1) % n, (i + n - 1) % n): that costs
// a compare, not a division. (a - b cannot overflow where a >= b > 0, nor a + b where -b <= a < 0.)
#define SP_INT_MOD(T)                                                                                 \
    SP_FUNC T mod(T a, T b) {                                                                        \
        if (b > 0 && a >= -b) {                                                                      \
            if (a < b) return a < 0 ? a + b : a;                                                     \
            if (a - b < b) return a - b;                                                             \
        }                                                                                            \
        if (b == 0 || b == -1) return 0;                                                             \
        T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r;                           \
    }
SP_INT_FLOORDIV(int32_t, uint32_t)
SP_INT_FLOORDIV(int64_t, uint64_t)
SP_INT_MOD(int32_t)
SP_INT_MOD(int64_t)
// Floats follow Python's (and NumPy's npy_divmod) algorithm, which is exact where floor(a / b) is not:
// 1.0 // 0.1 is 9.0 and 1.0 % 0.1 is 0.09999999999999995, as in Python.
#define SP_FLOAT_DIVMOD(T, FMOD, FLOOR, COPYSIGN)                                                     \
    SP_FUNC T floordiv(T a, T b) {                                                                   \
        T m = ::FMOD(a, b);                                                                          \
        if (b == T(0)) return a / b;                                                                 \
        T d = (a - m) / b;                                                                           \
        if (m != T(0) && ((b < T(0)) != (m < T(0)))) d -= T(1);                                      \
        if (d == T(0)) return ::COPYSIGN(T(0), a / b);                                               \
        T f = ::FLOOR(d); if (d - f > T(0.5)) f += T(1); return f; }                                \
    SP_FUNC T mod(T a, T b) {                                                                        \
        T m = ::FMOD(a, b);                                                                          \
        if (b == T(0)) return m;                                                                     \
        if (m != T(0)) { if ((b < T(0)) != (m < T(0))) m += b; } else m = ::COPYSIGN(T(0), b);      \
        return m; }
SP_FLOAT_DIVMOD(float, fmodf, floorf, copysignf)
SP_FLOAT_DIVMOD(double, fmod, floor, copysign)
SP_MAP2(floordiv, 0) SP_MAP2(mod, 0)

template <typename T> SP_FUNC bool eq(T a, T b) { return a == b; }
template <typename T> SP_FUNC bool ne(T a, T b) { return a != b; }
template <typename T> SP_FUNC bool lt(T a, T b) { return a < b; }
template <typename T> SP_FUNC bool le(T a, T b) { return a <= b; }
template <typename T> SP_FUNC bool gt(T a, T b) { return a > b; }
template <typename T> SP_FUNC bool ge(T a, T b) { return a >= b; }
SP_FUNC bool logical_and(bool a, bool b) { return a && b; }
SP_FUNC bool logical_or(bool a, bool b) { return a || b; }
SP_FUNC bool logical_not(bool a) { return !a; }
template <typename T> SP_FUNC T where(bool c, const T& a, const T& b) { return c ? a : b; }
#ifndef SP_CUDA
// `where` for the gather form's row variant (compiler/codegen/targets.py): its conditions are the
// same for a whole row (they test the clamped outer indices), and GCC does not vectorise a float
// select on such a loop-invariant bool (3-D 8th-order adjoints ran their face rows one thread at a
// time). A float's bits blended by a mask vectorise as and/or; exact, it picks a's or b's bits.
template <typename T> SP_FUNC T blend(bool c, const T& a, const T& b) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
        U ua, ub;
        std::memcpy(&ua, &a, sizeof(T));
        std::memcpy(&ub, &b, sizeof(T));
        const U m = U(0) - U(c), r = (ua & m) | (ub & ~m);
        T out;
        std::memcpy(&out, &r, sizeof(T));
        return out;
    } else {
        return c ? a : b;
    }
}
#endif

template <typename R, typename T> SP_FUNC R cast(T x) { return R(x); }
template <typename R, typename... A> SP_FUNC R construct(A... a) { return R(a...); }

// ---- math ---------------------------------------------------------------------------------------
#define SP_UNARY(NAME, FF, FD)                                                                        \
    SP_FUNC float NAME(float x) { return ::FF(x); }                                                  \
    SP_FUNC double NAME(double x) { return ::FD(x); }
SP_UNARY(sin, sinf, sin) SP_UNARY(cos, cosf, cos) SP_UNARY(tan, tanf, tan)
SP_UNARY(asin, asinf, asin) SP_UNARY(acos, acosf, acos) SP_UNARY(atan, atanf, atan)
SP_UNARY(sinh, sinhf, sinh) SP_UNARY(cosh, coshf, cosh) SP_UNARY(tanh, tanhf, tanh)
SP_UNARY(exp, expf, exp) SP_UNARY(log, logf, log) SP_UNARY(log2, log2f, log2)
SP_UNARY(log10, log10f, log10) SP_UNARY(sqrt, sqrtf, sqrt) SP_UNARY(floor, floorf, floor)
SP_UNARY(ceil, ceilf, ceil) SP_UNARY(round, rintf, rint)
SP_FUNC float pow(float a, float b) { return ::powf(a, b); }
SP_FUNC double pow(double a, double b) { return ::pow(a, b); }
// Integer powers by squaring in unsigned arithmetic, so overflow wraps (as NumPy's) instead of being UB.
template <typename T, typename U> SP_FUNC T int_pow(T base, T e) {
    if (e < 0) return base == T(1) ? T(1) : base == T(-1) ? ((e & 1) ? T(-1) : T(1)) : T(0);
    U r = 1, b = U(base);
    while (e) { if (e & 1) r *= b; b *= b; e >>= 1; }
    return T(r); }
SP_FUNC int32_t pow(int32_t a, int32_t b) { return int_pow<int32_t, uint32_t>(a, b); }
SP_FUNC int64_t pow(int64_t a, int64_t b) { return int_pow<int64_t, uint64_t>(a, b); }
SP_FUNC float atan2(float a, float b) { return ::atan2f(a, b); }
SP_FUNC double atan2(double a, double b) { return ::atan2(a, b); }
SP_FUNC float abs(float x) { return ::fabsf(x); }
SP_FUNC double abs(double x) { return ::fabs(x); }
SP_FUNC int32_t abs(int32_t x) { return x < 0 ? -x : x; }
SP_FUNC int64_t abs(int64_t x) { return x < 0 ? -x : x; }
template <typename T> SP_FUNC T sign(T x) { return T((x > T(0)) - (x < T(0))); }
template <typename T> SP_FUNC T min(T a, T b) { return b < a ? b : a; }
template <typename T> SP_FUNC T max(T a, T b) { return a < b ? b : a; }
SP_MAP2(min, 0) SP_MAP2(max, 0) SP_MAP1(abs) SP_MAP1(sign)
// After the vector overloads of min/max, so that clamp of vectors finds them.
template <typename T> SP_FUNC T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
// Adjoint helpers of min/max/clamp on vectors and matrices: per component, g where a <= b (pick_le)
// or a >= b (pick_ge), else 0.
#define SP_PICK(T) SP_FUNC T pick_le(T a, T b, T g) { return a <= b ? g : T(0); } \
                   SP_FUNC T pick_ge(T a, T b, T g) { return a >= b ? g : T(0); }
SP_PICK(float) SP_PICK(double)
#define SP_MAP3(NAME)                                                                                \
    template <int N, typename T>                                                                     \
    SP_FUNC vec_t<N, T> NAME(const vec_t<N, T>& a, const vec_t<N, T>& b, const vec_t<N, T>& c) {    \
        vec_t<N, T> o; for (int i = 0; i < N; ++i) o[i] = NAME(a[i], b[i], c[i]); return o; }       \
    template <int R, int C, typename T>                                                              \
    SP_FUNC mat_t<R, C, T> NAME(const mat_t<R, C, T>& a, const mat_t<R, C, T>& b, const mat_t<R, C, T>& c) { \
        mat_t<R, C, T> o; for (int i = 0; i < R; ++i) o[i] = NAME(a[i], b[i], c[i]); return o; }
SP_MAP3(pick_le) SP_MAP3(pick_ge)
#ifdef SP_CUDA
SP_FUNC float inf_f32() { return __int_as_float(0x7f800000); }
SP_FUNC double inf_f64() { return __longlong_as_double(0x7ff0000000000000ll); }
#else
SP_FUNC float inf_f32() { return __builtin_huge_valf(); }
SP_FUNC double inf_f64() { return __builtin_huge_val(); }
#endif

// ---- vectors and matrices -----------------------------------------------------------------------
template <int N, typename T> SP_FUNC T dot(const vec_t<N, T>& a, const vec_t<N, T>& b) {
    T s = T(0); for (int i = 0; i < N; ++i) s += a[i] * b[i]; return s; }
template <int N, typename T> SP_FUNC T inner(const vec_t<N, T>& a, const vec_t<N, T>& b) { return dot(a, b); }
template <int R, int C, typename T> SP_FUNC T inner(const mat_t<R, C, T>& a, const mat_t<R, C, T>& b) {
    T s = T(0); for (int i = 0; i < R; ++i) s += dot(a[i], b[i]); return s; }
template <typename T> SP_FUNC T sum(T x) { return x; }
template <int N, typename T> SP_FUNC T sum(const vec_t<N, T>& a) { T s = T(0); for (int i = 0; i < N; ++i) s += a[i]; return s; }
template <int R, int C, typename T> SP_FUNC T sum(const mat_t<R, C, T>& a) { T s = T(0); for (int i = 0; i < R; ++i) s += sum(a[i]); return s; }
template <typename T> SP_FUNC vec_t<3, T> cross(const vec_t<3, T>& a, const vec_t<3, T>& b) {
    return vec_t<3, T>(a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]); }
template <int N, typename T> SP_FUNC T length_sq(const vec_t<N, T>& a) { return dot(a, a); }
template <int N, typename T> SP_FUNC T length(const vec_t<N, T>& a) { return sqrt(dot(a, a)); }
template <int N, typename T> SP_FUNC vec_t<N, T> normalize(const vec_t<N, T>& a) {
    T l = length(a); return l > T(0) ? div(a, l) : vec_t<N, T>(); }
template <int N, int M, typename T> SP_FUNC mat_t<N, M, T> outer(const vec_t<N, T>& a, const vec_t<M, T>& b) {
    mat_t<N, M, T> o; for (int i = 0; i < N; ++i) o[i] = mul(a[i], b); return o; }
template <int R, int C, typename T> SP_FUNC mat_t<C, R, T> transpose(const mat_t<R, C, T>& m) {
    mat_t<C, R, T> o; for (int i = 0; i < R; ++i) for (int j = 0; j < C; ++j) o[j][i] = m[i][j]; return o; }

template <typename T> SP_FUNC T determinant(const mat_t<2, 2, T>& m) { return m[0][0] * m[1][1] - m[0][1] * m[1][0]; }
template <typename T> SP_FUNC T determinant(const mat_t<3, 3, T>& m) { return dot(m[0], cross(m[1], m[2])); }
// The cofactor matrix: d det(M) / dM. Computed from minors, so it is defined for singular M too.
template <typename T> SP_FUNC mat_t<2, 2, T> cofactor(const mat_t<2, 2, T>& m) {
    return mat_t<2, 2, T>(m[1][1], -m[1][0], -m[0][1], m[0][0]); }
template <typename T> SP_FUNC mat_t<3, 3, T> cofactor(const mat_t<3, 3, T>& m) {
    return mat_t<3, 3, T>(cross(m[1], m[2]), cross(m[2], m[0]), cross(m[0], m[1])); }
template <typename T> SP_FUNC mat_t<4, 4, T> cofactor(const mat_t<4, 4, T>& m) {
    mat_t<4, 4, T> o;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
            mat_t<3, 3, T> s; int a = 0;
            for (int p = 0; p < 4; ++p) { if (p == i) continue; int b = 0;
                for (int q = 0; q < 4; ++q) { if (q == j) continue; s[a][b++] = m[p][q]; } ++a; }
            o[i][j] = ((i + j) % 2 ? T(-1) : T(1)) * determinant(s);
        }
    return o; }
template <typename T> SP_FUNC T determinant(const mat_t<4, 4, T>& m) { return dot(m[0], cofactor(m)[0]); }
template <int N, typename T> SP_FUNC mat_t<N, N, T> inverse(const mat_t<N, N, T>& m) {
    return div(transpose(cofactor(m)), determinant(m)); }

template <int N, typename T> SP_FUNC T extract(const vec_t<N, T>& v, int64_t i) { return v[i]; }
template <int R, int C, typename T> SP_FUNC vec_t<C, T> extract(const mat_t<R, C, T>& m, int64_t i) { return m[i]; }
template <int R, int C, typename T> SP_FUNC T extract(const mat_t<R, C, T>& m, int64_t i, int64_t j) { return m[i][j]; }
template <int N, typename T> SP_FUNC vec_t<N, T> insert(vec_t<N, T> v, int64_t i, T x) { v[i] = x; return v; }
template <int R, int C, typename T> SP_FUNC mat_t<R, C, T> insert(mat_t<R, C, T> m, int64_t i, const vec_t<C, T>& x) { m[i] = x; return m; }
template <int R, int C, typename T> SP_FUNC mat_t<R, C, T> insert(mat_t<R, C, T> m, int64_t i, int64_t j, T x) { m[i][j] = x; return m; }

// ---- arrays -------------------------------------------------------------------------------------
// Arrays are C-contiguous (launch checks it), so addresses come from the shape alone: a unit-stride
// innermost index is what lets the compiler vectorise streaming kernels.
template <typename T> SP_FUNC T* address(const array_t<T>& a, int64_t i) { return a.data + i; }
template <typename T> SP_FUNC T* address(const array_t<T>& a, int64_t i, int64_t j) {
    return a.data + (i * a.shape[1] + j); }
template <typename T> SP_FUNC T* address(const array_t<T>& a, int64_t i, int64_t j, int64_t k) {
    return a.data + ((i * a.shape[1] + j) * a.shape[2] + k); }
template <typename T> SP_FUNC T* address(const array_t<T>& a, int64_t i, int64_t j, int64_t k, int64_t l) {
    return a.data + (((i * a.shape[1] + j) * a.shape[2] + k) * a.shape[3] + l); }
// Whether the elements of two arrays (`na` and `nb` axes) share memory: a forward whose threads
// each write their own elements runs its loops without alias tests only where its written arrays
// share none with another argument (passes/interior.py, `writes_own_elements`).
template <typename T, typename U> SP_FUNC bool overlap(const array_t<T>& a, int na, const array_t<U>& b, int nb) {
    int64_t ca = 1, cb = 1;
    for (int d = 0; d < na; ++d) ca *= a.shape[d];
    for (int d = 0; d < nb; ++d) cb *= b.shape[d];
    const char *a0 = (const char*)a.data, *b0 = (const char*)b.data;
    return ca > 0 && cb > 0 && a0 < b0 + cb * (int64_t)sizeof(U) && b0 < a0 + ca * (int64_t)sizeof(T); }
// Whether two arrays are one (same elements, same shape): a forward's input and output that may be
// one array (passes/in_place.py) run its loops without alias tests then too.
template <typename T> SP_FUNC bool same(const array_t<T>& a, const array_t<T>& b, int n) {
    if (a.data != b.data) return false;
    for (int d = 0; d < n; ++d) if (a.shape[d] != b.shape[d]) return false;
    return true; }
template <typename T, typename... I> SP_FUNC bool in_bounds(const array_t<T>& a, I... idx) {
    int64_t v[] = {int64_t(idx)...}; for (int d = 0; d < int(sizeof...(I)); ++d) if (v[d] < 0 || v[d] >= a.shape[d]) return false;
    return true; }
template <typename T, typename... I> SP_FUNC T load(const array_t<T>& a, I... idx) { return *address(a, idx...); }
template <typename T, typename... I> SP_FUNC T load_or_zero(const array_t<T>& a, I... idx) {
    return in_bounds(a, idx...) ? load(a, idx...) : T(); }

// Deterministic launches that add into a few elements sum in chunks of this many threads (add_log
// on the CPU, add_slot on a GPU).
constexpr int64_t ADD_CHUNK = 4096;

// Scalar atomics return the old value.
#ifdef SP_CUDA
SP_FUNC float atomic_add_at(float* p, float v) { return atomicAdd(p, v); }
SP_FUNC double atomic_add_at(double* p, double v) { return atomicAdd(p, v); }
SP_FUNC int32_t atomic_add_at(int32_t* p, int32_t v) { return atomicAdd(p, v); }
SP_FUNC int64_t atomic_add_at(int64_t* p, int64_t v) { return (int64_t)atomicAdd((unsigned long long*)p, (unsigned long long)v); }
SP_FUNC int32_t atomic_min_at(int32_t* p, int32_t v) { return atomicMin(p, v); }
SP_FUNC int32_t atomic_max_at(int32_t* p, int32_t v) { return atomicMax(p, v); }
SP_FUNC int64_t atomic_min_at(int64_t* p, int64_t v) { return atomicMin((long long*)p, (long long)v); }
SP_FUNC int64_t atomic_max_at(int64_t* p, int64_t v) { return atomicMax((long long*)p, (long long)v); }
template <typename T, typename U, typename F> SP_FUNC T atomic_cas_loop(T* p, T v, F f) {
    U* u = (U*)p; U old = *u, assumed;
    do { assumed = old; T cur; SP_MEMCPY(&cur, &assumed, sizeof(T)); T nv = f(cur, v); U nu; SP_MEMCPY(&nu, &nv, sizeof(T));
         old = atomicCAS(u, assumed, nu); } while (old != assumed);
    T r; SP_MEMCPY(&r, &old, sizeof(T)); return r; }
// A GPU launch that logs its adds (launch_t::adds set; serial flag 2) runs one GPU thread per chunk
// of ADD_CHUNK threads, in order, and keeps the chunk's partials as add_log does on the CPU, in
// device memory: every chunk's count of partials (int64_t), then L.add_slots add_slots per chunk.
// sp_apply_adds then adds them to the elements chunk after chunk: the CPU's sums, bit for bit.
// Partials are double for float32 elements too (see add_log below).
struct add_slot { void* p; double d; int64_t is_double; };
SP_FUNC int64_t add_chunks(const launch_t& L) { return (L.end - L.first + ADD_CHUNK - 1) / ADD_CHUNK; }
SP_FUNC add_slot* chunk_slots(const launch_t& L, int64_t chunk) {
    return (add_slot*)((int64_t*)L.adds + add_chunks(L)) + chunk * L.add_slots; }
template <typename T> SP_FUNC T logged_add(const launch_t& L, T* p, T v) {
    const int64_t chunk = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t& count = ((int64_t*)L.adds)[chunk];
    add_slot* slots = chunk_slots(L, chunk);
    for (int64_t k = count - 1; k >= 0; --k)
        if (slots[k].p == (void*)p) { slots[k].d = slots[k].d + (double)v; return T(); }
    slots[count] = add_slot{(void*)p, (double)v, sizeof(T) == 8};   // at most add_slots elements: the host counts them
    ++count;
    return T();                                            // no caller of a logged launch uses the result
}
SP_FUNC float atomic_add_at(float* p, float v, const launch_t& L) { return L.adds ? logged_add(L, p, v) : atomic_add_at(p, v); }
SP_FUNC double atomic_add_at(double* p, double v, const launch_t& L) { return L.adds ? logged_add(L, p, v) : atomic_add_at(p, v); }
// The flat thread indices one GPU thread runs: a grid-stride walk over [first, end), or one chunk
// in order for a launch that logs its adds.
struct thread_range {
    int64_t first, end, step;
    SP_FUNC explicit thread_range(const launch_t& L) {
        const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
        if (L.adds) {
            first = L.first + g * ADD_CHUNK;
            end = first + ADD_CHUNK < L.end ? first + ADD_CHUNK : L.end;
            step = 1;
            if (first < L.end) ((int64_t*)L.adds)[g] = 0;
        } else {
            first = L.first + g;
            end = L.end;
            step = (int64_t)blockDim.x * gridDim.x;
        }
    }
};
#else
template <typename T> SP_FUNC T atomic_add_at(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
template <typename T, typename U, typename F> SP_FUNC T atomic_cas_loop(T* p, T v, F f) {
    U* u = (U*)p; U old = __atomic_load_n(u, __ATOMIC_RELAXED), nu; T cur;
    do { std::memcpy(&cur, &old, sizeof(T)); T nv = f(cur, v); std::memcpy(&nu, &nv, sizeof(T)); }
    while (!__atomic_compare_exchange_n(u, &old, nu, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return cur; }
// Deterministic launches that add into a few elements run in parallel (a loss, a shared
// parameter's gradient): the index space is cut into chunks of ADD_CHUNK threads (a fixed size, not
// one per OpenMP thread or GPU block); each chunk runs its threads in order and sums its float adds
// per element into a partial (the first add to an element starts it), and the partials are added to
// the elements chunk after chunk. The order of every sum is fixed by the launch size alone: the same
// bits on any thread count, and on a GPU (add_slot above keeps the same partials in device memory).
// Partials of float32 elements are double, and each chunk's reaches its element in one rounding: a
// shared parameter's gradient, summed over 10^4 threads a step, otherwise loses digits in every
// add (a float32 pendulum ensemble's dc was 2.6% off over 10^4 steps; issue 31).
struct add_log {
    std::vector<std::pair<float*, double>> f32;
    std::vector<std::pair<double*, double>> f64;
    size_t near32 = 0, near64 = 0;      // where the last add found its element
    // The partial of `p`, looked for outwards from where the last add found its element: a thread
    // adds where its neighbours just did (a stencil's shared coefficients), so this finds it in a
    // step or two where a scan from either end costs about the log's length (40 elements: 8 us a
    // launch of 160 threads). Each element has one partial, so where it is found changes no sum.
    template <typename T> static void add_to(std::vector<std::pair<T*, double>>& log, size_t& near, T* p, double v) {
        const size_t n = log.size();
        for (size_t d = 0; d < n; ++d) {
            const size_t up = near + d, down = near - d;      // (wraps past 0 to a huge value)
            if (up < n && log[up].first == p) { log[up].second = log[up].second + v; near = up; return; }
            if (d && down < n && log[down].first == p) { log[down].second = log[down].second + v; near = down; return; }
            if (up >= n && down >= n) break;
        }
        near = n;
        log.emplace_back(p, v);
    }
    void add(float* p, float v) { add_to(f32, near32, p, (double)v); }
    void add(double* p, double v) { add_to(f64, near64, p, v); }
    void apply() const {          // one partial per element: the order within a chunk does not matter
        for (const auto& e : f32) *e.first = (float)((double)*e.first + e.second);
        for (const auto& e : f64) *e.first = *e.first + e.second;
    }
};
inline thread_local add_log* adds_log = nullptr;     // this thread's log while a logged loop runs
template <typename T> SP_FUNC T logged_or_atomic_add(T* p, T v) {
    if (adds_log) { adds_log->add(p, v); return T(); }    // no caller of a logged launch uses the result
    return atomic_cas_loop<T, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>(p, v, [](T a, T b) { return a + b; }); }
SP_FUNC float atomic_add_at(float* p, float v) { return logged_or_atomic_add(p, v); }
SP_FUNC double atomic_add_at(double* p, double v) { return logged_or_atomic_add(p, v); }
template <typename T> SP_FUNC T atomic_add_at(T* p, T v, const launch_t&) { return atomic_add_at(p, v); }
template <typename T> SP_FUNC T atomic_min_at(T* p, T v) { return atomic_cas_loop<T, T>(p, v, [](T a, T b) { return b < a ? b : a; }); }
template <typename T> SP_FUNC T atomic_max_at(T* p, T v) { return atomic_cas_loop<T, T>(p, v, [](T a, T b) { return a < b ? b : a; }); }
#endif
SP_FUNC float atomic_min_at(float* p, float v) { return atomic_cas_loop<float, uint32_t>(p, v, [](float a, float b) { return b < a ? b : a; }); }
SP_FUNC float atomic_max_at(float* p, float v) { return atomic_cas_loop<float, uint32_t>(p, v, [](float a, float b) { return a < b ? b : a; }); }
SP_FUNC double atomic_min_at(double* p, double v) { return atomic_cas_loop<double, uint64_t>(p, v, [](double a, double b) { return b < a ? b : a; }); }
SP_FUNC double atomic_max_at(double* p, double v) { return atomic_cas_loop<double, uint64_t>(p, v, [](double a, double b) { return a < b ? b : a; }); }
#ifdef SP_CUDA
SP_FUNC int32_t atomic_add_at(int32_t* p, int32_t v, const launch_t&) { return atomic_add_at(p, v); }   // exact in any order
SP_FUNC int64_t atomic_add_at(int64_t* p, int64_t v, const launch_t&) { return atomic_add_at(p, v); }
#endif
// Adds take the launch: a GPU launch that logs its adds keeps them in its chunk's partials.
template <int N, typename T> SP_FUNC vec_t<N, T> atomic_add_at(vec_t<N, T>* p, const vec_t<N, T>& v, const launch_t& L) {
    vec_t<N, T> old; for (int i = 0; i < N; ++i) old[i] = atomic_add_at(&p->c[i], v[i], L); return old; }
template <int R, int C, typename T> SP_FUNC mat_t<R, C, T> atomic_add_at(mat_t<R, C, T>* p, const mat_t<R, C, T>& v,
                                                                        const launch_t& L) {
    mat_t<R, C, T> old; for (int i = 0; i < R; ++i) old[i] = atomic_add_at(&p->r[i], v[i], L); return old; }
template <typename T> SP_FUNC T atomic_sub_at(T* p, const T& v, const launch_t& L) { return atomic_add_at(p, neg(v), L); }

// Gradient arrays may be absent (data == nullptr) for arguments that do not require grad. An adjoint
// body is a template on two masks over its parameters: bit K of KNOWN says whether parameter K's
// gradient is settled at compile time, present (bit K of HAS) or absent; an unsettled one is tested
// at run time. A settled body has no null tests (its thread loop can vectorise) and an absent
// gradient's accumulations are dead code.
constexpr uint64_t ALL_GRADS = ~uint64_t(0);
template <uint64_t KNOWN, uint64_t HAS, int K, typename T> SP_FUNC bool has_grad(const array_t<T>& a) {
    return ((KNOWN >> K) & 1) ? bool((HAS >> K) & 1) : a.data != nullptr; }
template <uint64_t KNOWN, uint64_t HAS, int K, typename T, typename... I> SP_FUNC T read_grad(const array_t<T>& a,
                                                                                             I... idx) {
    return has_grad<KNOWN, HAS, K>(a) ? *address(a, idx...) : T(); }

// ---- the per-thread tape of the dynamic-loop adjoint ---------------------------------------------
// Word w of thread t lives at base[w * stride + t]: consecutive threads touch consecutive words.
struct tape_t {
    uint64_t* base;
    int64_t stride;
    int64_t pos;
    int64_t capacity;
    int count_only;
    int overflow;
    int serial;        // deterministic launch: threads run one after another, so no atomics needed
    int64_t fresh;     // gather forms: bit k set = parameter k's gradient is new memory standing for zeros
    // a two-pass form's scratch arrays on the CPU (sp::scratch, codegen/scratch.py): the elements
    // each holds; and where they hold a ring of the launch's rows of its first axis, the rows in the
    // ring, the first row of the ring's current turn, and the elements of a row
    int64_t window_n;
    int64_t ring_rows;
    int64_t ring_at;
    int64_t plane;
};
// A two-pass gather form's scratch memory (compiler/passes/transpose.py): the launch's first pass
// stores per-thread values that its second pass reads at neighbouring threads. Element i of an
// array of `n` T (one per thread of the launch, or of a halo form's launch grown by its halo) lies
// at n * offset bytes (offsets are multiples of T's alignment) plus i. On the CPU the arrays of a
// launch of more than one axis may hold a ring of rows of its first axis instead (codegen/scratch.py):
// `row` is element i's row, which lies in the ring's current turn or the next
// (ring_at <= row < ring_at + 2 ring_rows), at place row - turn there. The row is the same for a
// row of threads, so its place is worked out once a row and the threads along it read
// consecutive elements.
// The first row of the ring's turn that holds `row` (its place there is row - ring_turn), without a
// branch: a value computed under a branch in the loop over a row's threads is not one the
// vectoriser sees as fixed along it (it gathered instead).
SP_FUNC int64_t ring_turn(int64_t row, int64_t ring_at, int64_t ring_rows) {
    const int64_t past = row - ring_at - ring_rows;                 // >= 0: the next turn
    return ring_at + (ring_rows & ~(past >> 63));
}
template <typename T> SP_FUNC T& scratch(const tape_t& tp, int64_t n, int64_t offset, int64_t i, int64_t row) {
#ifdef SP_CUDA
    (void)row;
    return ((T*)((char*)tp.base + n * offset))[i];
#else
    (void)n;
    return ((T*)((char*)tp.base + tp.window_n * offset))[i - ring_turn(row, tp.ring_at, tp.ring_rows) * tp.plane];
#endif
}
// One axis: arrays over the whole launch.
template <typename T> SP_FUNC T& scratch(const tape_t& tp, int64_t n, int64_t offset, int64_t i) {
#ifdef SP_CUDA
    return ((T*)((char*)tp.base + n * offset))[i];
#else
    (void)n;
    return ((T*)((char*)tp.base + tp.window_n * offset))[i];
#endif
}
#ifndef SP_CUDA
// The threads an OpenMP loop of the entry's would share its work among.
static inline int max_threads() {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
// On the CPU a two-pass form's entry runs both passes; its scratch memory is kept per calling thread
// between launches (no allocation per launch; nothing in it outlives the launch that filled it).
// On a GPU the runtime passes device memory as the tape (backends/cuda_launch.py).
static inline uint64_t* scratch_memory(int64_t bytes) {
    static thread_local std::vector<uint64_t> memory;
    if ((int64_t)memory.size() * 8 < bytes) memory.resize((size_t)((bytes + 7) / 8));
    return memory.data();
}
// The few bytes at a row's end of a halo: stores of a size the compiler knows, not a call to memset
// (two calls a row were most of zeroing a 3-D halo: 64^3 at radius 1, 27 us a launch, 11 without).
static inline void zero_row_end(char* p, int64_t bytes) {
    switch (bytes) {
    case 4: __builtin_memset(p, 0, 4); return;
    case 8: __builtin_memset(p, 0, 8); return;
    case 12: __builtin_memset(p, 0, 12); return;
    case 16: __builtin_memset(p, 0, 16); return;
    case 24: __builtin_memset(p, 0, 24); return;
    case 32: __builtin_memset(p, 0, 32); return;
    default: memset(p, 0, (size_t)bytes);
    }
}
// A halo form's scratch array (compiler/passes/transpose.py) of `size`-byte values over the launch's
// extents e grown by pad[k] at each end of axis k: zero its elements outside the launch, the roots
// of threads that do not exist, which the transposed pass reads near the faces. Row by row of the
// innermost axis (the outer axes' indices counted along, not divided out of the row's number): a
// row outside the launch whole, the others at their two ends.
static inline void zero_halo(char* array, int64_t size, int ndim, const int64_t* e, const int64_t* pad) {
    int64_t rows = 1, at[4] = {0, 0, 0, 0};
    for (int k = 0; k < ndim - 1; ++k) rows *= e[k] + 2 * pad[k];
    const int64_t inner = (e[ndim - 1] + 2 * pad[ndim - 1]) * size, end = pad[ndim - 1] * size;
    char* row = array;
    for (int64_t r = 0; r < rows; ++r, row += inner) {
        bool outside = false;
        for (int k = 0; k < ndim - 1; ++k) outside = outside || at[k] < pad[k] || at[k] >= pad[k] + e[k];
        if (outside) {
            memset(row, 0, (size_t)inner);
        } else {
            zero_row_end(row, end);
            zero_row_end(row + inner - end, end);
        }
        for (int k = ndim - 2; k >= 0 && ++at[k] == e[k] + 2 * pad[k]; --k) at[k] = 0;
    }
}
#endif
// Adjoints scatter into gradient arrays: atomically, or with a plain add when threads run serially
// (the compare-and-swap loop costs far more than the add, and the order is then fixed anyway).
template <typename T> SP_FUNC void accum_grad(T* p, const T& v, int serial, const launch_t& L) {
    if (serial) *p = add(*p, v); else atomic_add_at(p, v, L); }
// A gather form's one write per gradient element: into fresh memory it stores 0 + v (the bits of
// adding v to a zeroed gradient) without reading what is there, so nobody zero-fills it first.
template <typename T> SP_FUNC void gather_grad(T* p, const T& v, int64_t fresh) {
    *p = add(fresh ? T() : *p, v); }
template <typename T> SP_FUNC void push(tape_t& tp, const T& v) {
    const int W = (sizeof(T) + 7) / 8;
    if (tp.count_only) { tp.pos += W; return; }
    if (tp.pos + W > tp.capacity) { tp.overflow = 1; return; }
    uint64_t w[W] = {}; SP_MEMCPY(w, &v, sizeof(T));
    for (int k = 0; k < W; ++k) tp.base[(tp.pos + k) * tp.stride] = w[k];
    tp.pos += W; }
template <typename T> SP_FUNC void pop(tape_t& tp, T& v) {
    const int W = (sizeof(T) + 7) / 8;
    if (tp.overflow || tp.pos < W) { tp.overflow = 1; return; }
    tp.pos -= W; uint64_t w[W];
    for (int k = 0; k < W; ++k) w[k] = tp.base[(tp.pos + k) * tp.stride];
    SP_MEMCPY(&v, w, sizeof(T)); }

}  // namespace sp
