// The device-local backend's reduction kernel (actors/src/device/cuda/local.rs): for every
// element i, acc = pre(src[0][i]); acc = combine(acc, pre(src[j][i])) for j = 1.., in
// order; then post(acc) written to every output. The same bits as the host reference
// (runtime/src/tensor/reduce.rs): left to right in rank order, f16/bf16 widened to f32 and
// rounded back (to nearest even) after every pairwise step, PremulSum's scaling of each
// input in the element type (through f64 for f32/f64, f32 for the 16-bit types), Avg's one
// division at the end, NaN-propagating min/max with -0 below +0, wrapping integers.
//
// Compiled to PTX by bench/gen_ptx.py (NVRTC, --fmad=false so that no multiply-add is
// contracted: the host rounds each step); the PTX is kernels/fold.ptx, loaded at run time by
// the driver, so no CUDA compiler is needed where collectix runs.
//
// Each thread reads every source at its index before it writes any output, so an output
// that is also a source (an in-place all_reduce) is safe.

#define MAX_PTRS 32

struct Ptrs {
    unsigned long long p[MAX_PTRS];
};

// The pairwise operations (`Combine` in reduce.rs); bool is reduced as u8 with its ops
// mapped to OR/AND by the caller.
#define OP_SUM 0
#define OP_PROD 1
#define OP_MIN 2
#define OP_MAX 3
#define OP_AND 4
#define OP_OR 5
#define OP_XOR 6

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// ---- f16 and bf16 <-> f32, bit for bit as the `half` crate's conversions ----

__device__ float f16_to_f32(u16 h) {
    u32 sign = ((u32)(h & 0x8000u)) << 16;
    u32 exp = (h >> 10) & 0x1fu;
    u32 man = h & 0x3ffu;
    u32 bits;
    if (exp == 0x1fu) {
        // Infinity, or NaN with its payload kept and the quiet bit set.
        bits = sign | 0x7f800000u | (man != 0 ? 0x00400000u : 0) | (man << 13);
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {
            // Subnormal: normalise.
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            bits = sign | ((u32)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return __int_as_float((int)bits);
}

__device__ u16 f32_to_f16(float f) {
    u32 x = (u32)__float_as_int(f);
    u32 sign = x & 0x80000000u;
    u32 exp = x & 0x7f800000u;
    u32 man = x & 0x007fffffu;
    if (exp == 0x7f800000u) {
        u32 nan_bit = man == 0 ? 0 : 0x0200u;
        return (u16)((sign >> 16) | 0x7c00u | nan_bit | (man >> 13));
    }
    u32 half_sign = sign >> 16;
    int unbiased = (int)(exp >> 23) - 127;
    int half_exp = unbiased + 15;
    if (half_exp >= 0x1f) {
        return (u16)(half_sign | 0x7c00u);
    }
    if (half_exp <= 0) {
        if (14 - half_exp > 24) {
            return (u16)half_sign;
        }
        u32 m = man | 0x00800000u;
        u32 half_man = m >> (14 - half_exp);
        u32 round_bit = 1u << (13 - half_exp);
        if ((m & round_bit) != 0 && (m & (3 * round_bit - 1)) != 0) {
            half_man += 1;
        }
        return (u16)(half_sign | half_man);
    }
    u32 he = ((u32)half_exp) << 10;
    u32 hm = man >> 13;
    u32 round_bit = 0x00001000u;
    if ((x & round_bit) != 0 && (x & (3 * round_bit - 1)) != 0) {
        return (u16)((half_sign | he | hm) + 1);
    }
    return (u16)(half_sign | he | hm);
}

__device__ float bf16_to_f32(u16 h) {
    return __int_as_float((int)(((u32)h) << 16));
}

__device__ u16 f32_to_bf16(float f) {
    u32 x = (u32)__float_as_int(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
        return (u16)((x >> 16) | 0x0040u);
    }
    u32 round_bit = 0x00008000u;
    if ((x & round_bit) != 0 && (x & (3 * round_bit - 1)) != 0) {
        return (u16)((x >> 16) + 1);
    }
    return (u16)(x >> 16);
}

// ---- NaN-propagating min/max, -0 below +0 (reduce.rs's float_minmax) ----

__device__ float max_f32(float a, float b) {
    if (isnan(a) || isnan(b)) return __int_as_float(0x7fc00000);
    if (a > b) return a;
    if (b > a) return b;
    return signbit(a) ? b : a;
}
__device__ float min_f32(float a, float b) {
    if (isnan(a) || isnan(b)) return __int_as_float(0x7fc00000);
    if (a < b) return a;
    if (b < a) return b;
    return signbit(a) ? a : b;
}
__device__ double max_f64(double a, double b) {
    if (isnan(a) || isnan(b)) return __longlong_as_double(0x7ff8000000000000ll);
    if (a > b) return a;
    if (b > a) return b;
    return signbit(a) ? b : a;
}
__device__ double min_f64(double a, double b) {
    if (isnan(a) || isnan(b)) return __longlong_as_double(0x7ff8000000000000ll);
    if (a < b) return a;
    if (b < a) return b;
    return signbit(a) ? a : b;
}

// ---- one element type: load, pre, combine, post ----

struct F32 {
    typedef float T;
    __device__ static T pre(T x, double s) { return (float)((double)x * s); }
    __device__ static T comb(int op, T a, T b) {
        switch (op) {
        case OP_SUM: return __fadd_rn(a, b);
        case OP_PROD: return __fmul_rn(a, b);
        case OP_MIN: return min_f32(a, b);
        default: return max_f32(a, b);
        }
    }
    __device__ static T post(T x, int n) { return __fdiv_rn(x, (float)n); }
};

struct F64 {
    typedef double T;
    __device__ static T pre(T x, double s) { return __dmul_rn(x, s); }
    __device__ static T comb(int op, T a, T b) {
        switch (op) {
        case OP_SUM: return __dadd_rn(a, b);
        case OP_PROD: return __dmul_rn(a, b);
        case OP_MIN: return min_f64(a, b);
        default: return max_f64(a, b);
        }
    }
    __device__ static T post(T x, int n) { return __ddiv_rn(x, (double)n); }
};

// 16-bit floats: combined in f32, rounded back after each step.
#define HALF_TYPE(NAME, TO, FROM)                                                         \
    struct NAME {                                                                         \
        typedef u16 T;                                                                    \
        __device__ static T pre(T x, double s) {                                          \
            return FROM(__fmul_rn(TO(x), (float)s));                                      \
        }                                                                                 \
        __device__ static T comb(int op, T a, T b) {                                      \
            float x = TO(a), y = TO(b);                                                   \
            switch (op) {                                                                 \
            case OP_SUM: return FROM(__fadd_rn(x, y));                                    \
            case OP_PROD: return FROM(__fmul_rn(x, y));                                   \
            case OP_MIN: return FROM(min_f32(x, y));                                      \
            default: return FROM(max_f32(x, y));                                          \
            }                                                                             \
        }                                                                                 \
        __device__ static T post(T x, int n) { return FROM(__fdiv_rn(TO(x), (float)n)); } \
    };
HALF_TYPE(F16, f16_to_f32, f32_to_f16)
HALF_TYPE(BF16, bf16_to_f32, f32_to_bf16)

// Integers: wrapping sum and product (in the unsigned type of the same width), signed or
// unsigned min/max, bitwise ops; no pre or post (Avg and PremulSum are floats only).
#define INT_TYPE(NAME, S, U)                                        \
    struct NAME {                                                   \
        typedef S T;                                                \
        __device__ static T pre(T x, double) { return x; }          \
        __device__ static T comb(int op, T a, T b) {                \
            switch (op) {                                           \
            case OP_SUM: return (T)(U)((U)a + (U)b);                \
            case OP_PROD: return (T)(U)((U)a * (U)b);               \
            case OP_MIN: return a < b ? a : b;                      \
            case OP_MAX: return a > b ? a : b;                      \
            case OP_AND: return (T)((U)a & (U)b);                   \
            case OP_OR: return (T)((U)a | (U)b);                    \
            default: return (T)((U)a ^ (U)b);                       \
            }                                                       \
        }                                                           \
        __device__ static T post(T x, int) { return x; }            \
    };
INT_TYPE(U8, u8, u8)
INT_TYPE(I8, i8, u8)
INT_TYPE(U16, u16, u16)
INT_TYPE(I16, i16, u16)
INT_TYPE(U32, u32, u32)
INT_TYPE(I32, i32, u32)
INT_TYPE(U64, u64, u64)
INT_TYPE(I64, i64, u64)

// acc_first: the first output already holds the fold of earlier sources (a fold over more
// than MAX_PTRS sources runs in several launches); premul: apply pre to each source; divide:
// post's divisor (0: none).
template <class K>
__device__ void fold(Ptrs src, int nsrc, Ptrs out, int nout, u64 n, int op, double scalar,
                     int premul, int divide, int acc_first) {
    typedef typename K::T T;
    u64 stride = (u64)blockDim.x * gridDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        T acc;
        int j = 0;
        if (acc_first) {
            acc = ((const T*)out.p[0])[i];
        } else {
            acc = ((const T*)src.p[0])[i];
            if (premul) acc = K::pre(acc, scalar);
            j = 1;
        }
        for (; j < nsrc; j++) {
            T x = ((const T*)src.p[j])[i];
            if (premul) x = K::pre(x, scalar);
            acc = K::comb(op, acc, x);
        }
        if (divide > 0) acc = K::post(acc, divide);
        for (int o = 0; o < nout; o++) {
            ((T*)out.p[o])[i] = acc;
        }
    }
}

#define ENTRY(NAME, K)                                                                     \
    extern "C" __global__ void NAME(Ptrs src, int nsrc, Ptrs out, int nout, u64 n, int op, \
                                    double scalar, int premul, int divide, int acc_first) { \
        fold<K>(src, nsrc, out, nout, n, op, scalar, premul, divide, acc_first);           \
    }
ENTRY(fold_f32, F32)
ENTRY(fold_f64, F64)
ENTRY(fold_f16, F16)
ENTRY(fold_bf16, BF16)
ENTRY(fold_u8, U8)
ENTRY(fold_i8, I8)
ENTRY(fold_u16, U16)
ENTRY(fold_i16, I16)
ENTRY(fold_u32, U32)
ENTRY(fold_i32, I32)
ENTRY(fold_u64, U64)
ENTRY(fold_i64, I64)
