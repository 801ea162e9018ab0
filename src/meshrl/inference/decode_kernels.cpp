// Fused float32 kernels of one decode step (see native.py): RMSNorm, RoPE + KV-cache write +
// grouped-query attention over a row's live slots, and SiLU(gate) * up.
//
// Plain C ABI over raw pointers, called through ctypes: no torch headers, so it compiles in a few
// seconds. The matmuls stay in torch (MKL); these replace the ~20 small kernels per layer
// between them. Layouts are the ones transformer.py builds:
//   qkv   [B, KV, G + 2, hd]  rows per KV head: v, k, q_1 .. q_G; k and q have RoPE pairs adjacent
//   rope  [P, hd / 2, 2]      cos, sin per position
//   cache [B_alloc, KV, slots, hd] for one layer (row stride KV * slots * hd)
//   out   [B, KV * G * hd]    query head j * G + g at offset (j * G + g) * hd
#include <cmath>
#include <cstdint>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

// exp(x) for 8 floats: Cephes polynomial (rel. error ~1e-7), inputs clamped to [-88, 88].
static inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3333519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)),
                                23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// v[i] = exp(v[i] - shift) for i < n; returns the sum.
static float exp_shift_sum(float* v, int n, float shift) {
  __m256 s8 = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), s8));
    _mm256_storeu_ps(v + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float sum = 0.f;
  for (float l : lanes) sum += l;
  for (; i < n; ++i) sum += (v[i] = std::exp(v[i] - shift));
  return sum;
}

// sum of exp(v[i] / t - shift) for i < n (v unchanged)
static float exp_div_sum(const float* v, int n, float t, float shift) {
  __m256 s8 = _mm256_set1_ps(shift), t8 = _mm256_set1_ps(t), acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_add_ps(acc, exp8(_mm256_sub_ps(_mm256_div_ps(_mm256_loadu_ps(v + i), t8), s8)));
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float sum = 0.f;
  for (float l : lanes) sum += l;
  for (; i < n; ++i) sum += std::exp(v[i] / t - shift);
  return sum;
}

static void silu_mul_row(const float* gate, const float* up, float* out, int n) {
  int i = 0;
  const __m256 one = _mm256_set1_ps(1.f);
  for (; i + 8 <= n; i += 8) {
    __m256 g = _mm256_loadu_ps(gate + i);
    __m256 den = _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, den), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}
#else
static float exp_div_sum(const float* v, int n, float t, float shift) {
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += std::exp(v[i] / t - shift);
  return sum;
}

static float exp_shift_sum(float* v, int n, float shift) {
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += (v[i] = std::exp(v[i] - shift));
  return sum;
}

static void silu_mul_row(const float* gate, const float* up, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
}
#endif

static inline float dot(const float* __restrict a, const float* __restrict b, int n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

#if defined(__AVX2__) && defined(__FMA__)
static inline __m256 hsum8x8(const __m256* a) {  // lane t = sum of the 8 lanes of a[t]
  __m256 s01 = _mm256_hadd_ps(a[0], a[1]), s23 = _mm256_hadd_ps(a[2], a[3]);
  __m256 s45 = _mm256_hadd_ps(a[4], a[5]), s67 = _mm256_hadd_ps(a[6], a[7]);
  __m256 lo = _mm256_hadd_ps(s01, s23), hi = _mm256_hadd_ps(s45, s67);
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}
#endif

// sc[t] = q . k[t] for t < n (k rows hd apart)
static void scores_row(const float* q, const float* k, float* sc, int n, int hd) {
  int t = 0;
#if defined(__AVX2__) && defined(__FMA__)
  if (hd % 8 == 0) {
    for (; t + 8 <= n; t += 8) {
      __m256 acc[8];
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
      for (int i = 0; i < hd; i += 8) {
        __m256 qi = _mm256_loadu_ps(q + i);
        for (int u = 0; u < 8; ++u)
          acc[u] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k + (int64_t)(t + u) * hd + i), acc[u]);
      }
      _mm256_storeu_ps(sc + t, hsum8x8(acc));
    }
  }
#endif
  for (; t < n; ++t) sc[t] = dot(q, k + (int64_t)t * hd, hd);
}

#if defined(__AVX2__) && defined(__FMA__)
// s0[t] = q0 . k[t] and s1[t] = q1 . k[t] for t < n: two queries of a KV head share each key load.
static void scores_pair(const float* q0, const float* q1, const float* k, float* s0, float* s1,
                        int n, int hd) {
  int t = 0;
  if (hd % 8 == 0) {
    for (; t + 4 <= n; t += 4) {
      __m256 acc[8];  // acc[u] = q0 . k[t + u], acc[4 + u] = q1 . k[t + u] (8 lanes each)
      for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
      const float* kt = k + (int64_t)t * hd;
      for (int i = 0; i < hd; i += 8) {
        __m256 a = _mm256_loadu_ps(q0 + i), b = _mm256_loadu_ps(q1 + i);
        for (int u = 0; u < 4; ++u) {
          __m256 ku = _mm256_loadu_ps(kt + (int64_t)u * hd + i);
          acc[u] = _mm256_fmadd_ps(a, ku, acc[u]);
          acc[4 + u] = _mm256_fmadd_ps(b, ku, acc[4 + u]);
        }
      }
      __m256 s = hsum8x8(acc);
      _mm_storeu_ps(s0 + t, _mm256_castps256_ps128(s));
      _mm_storeu_ps(s1 + t, _mm256_extractf128_ps(s, 1));
    }
  }
  for (; t < n; ++t) {
    s0[t] = dot(q0, k + (int64_t)t * hd, hd);
    s1[t] = dot(q1, k + (int64_t)t * hd, hd);
  }
}
#else
static void scores_pair(const float* q0, const float* q1, const float* k, float* s0, float* s1,
                        int n, int hd) {
  scores_row(q0, k, s0, n, hd);
  scores_row(q1, k, s1, n, hd);
}
#endif

// o[i] = sum_t p[t] * v[t][i] * scale for i < hd (v rows hd apart). Blocks of 64 columns keep
// their 8 accumulators in registers for one pass over v; the rest go 8 columns per pass.
static void weighted_sum(const float* p, const float* v, float* o, int n, int hd, float scale) {
  int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 sc = _mm256_set1_ps(scale);
  for (; i + 64 <= hd; i += 64) {
    __m256 a[8];
    for (int u = 0; u < 8; ++u) a[u] = _mm256_setzero_ps();
    for (int t = 0; t < n; ++t) {
      const __m256 pt = _mm256_set1_ps(p[t]);
      const float* vt = v + (int64_t)t * hd + i;
      for (int u = 0; u < 8; ++u) a[u] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(vt + 8 * u), a[u]);
    }
    for (int u = 0; u < 8; ++u) _mm256_storeu_ps(o + i + 8 * u, _mm256_mul_ps(a[u], sc));
  }
  for (; i + 8 <= hd; i += 8) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int t = 0;
    for (; t + 2 <= n; t += 2) {
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + (int64_t)t * hd + i), a0);
      a1 = _mm256_fmadd_ps(_mm256_set1_ps(p[t + 1]),
                           _mm256_loadu_ps(v + (int64_t)(t + 1) * hd + i), a1);
    }
    for (; t < n; ++t)
      a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + (int64_t)t * hd + i), a0);
    _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_add_ps(a0, a1), sc));
  }
#endif
  for (; i < hd; ++i) {
    float acc = 0.f;
    for (int t = 0; t < n; ++t) acc += p[t] * v[(int64_t)t * hd + i];
    o[i] = acc * scale;
  }
}

// Run fn(lo, hi) over [0, n) on `threads` OpenMP threads. The library links libgomp, which the
// loader resolves to the copy torch already loaded, so this is torch's (and MKL's) thread pool:
// no threads of our own, and the workers are usually still spinning after the last matmul.
template <class F>
static void split_rows(int n, int threads, F fn) {
  if (threads <= 1 || n < 2) {
    fn(0, n);
    return;
  }
  if (threads > n) threads = n;
#pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
    int t = 0, nt = 1;
#endif
    int chunk = (n + nt - 1) / nt, lo = t * chunk, hi = lo + chunk < n ? lo + chunk : n;
    if (lo < hi) fn(lo, hi);
  }
}

extern "C" {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) (* w when w is not null)
void meshrl_rms(const float* x, float* y, const float* w, int rows, int d, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + (int64_t)r * d;
    float* yr = y + (int64_t)r * d;
    float inv = 1.f / std::sqrt(dot(xr, xr, d) / d + eps);
    if (w) {
#pragma omp simd
      for (int i = 0; i < d; ++i) yr[i] = xr[i] * inv * w[i];
    } else {
#pragma omp simd
      for (int i = 0; i < d; ++i) yr[i] = xr[i] * inv;
    }
  }
}

// out[r, i] = silu(gu[r, i]) * gu[r, inter + i]
void meshrl_silu_mul(const float* gu, float* out, int rows, int inter, int threads) {
  split_rows(rows, threads, [=](int lo, int hi) {
    for (int r = lo; r < hi; ++r)
      silu_mul_row(gu + (int64_t)r * 2 * inter, gu + (int64_t)r * 2 * inter + inter,
                   out + (int64_t)r * inter, inter);
  });
}

// RoPE on k and the G queries, k and v written to cache slot `slot`, then softmax attention of
// each query over slots [start[b], slot] of its row. scale multiplies q . k.
void meshrl_attend(const float* qkv, const float* rope, const int64_t* pos, const int64_t* start,
                   float* kc, float* vc, float* out, int B, int KV, int G, int hd, int slots,
                   int slot, float scale, int threads) {
  const int half = hd / 2;
  const int64_t row_stride = (int64_t)KV * slots * hd, head_stride = (int64_t)slots * hd;
  split_rows(B, threads, [=](int lo, int hi) {
    std::vector<float> qbuf((size_t)G * hd), scores((size_t)G * (slot + 1));
    for (int b = lo; b < hi; ++b) {
      const float* rot = rope + pos[b] * hd;  // [half, 2]
      const int first = (int)start[b], n = slot + 1 - first;
      for (int j = 0; j < KV; ++j) {
        const float* src = qkv + ((int64_t)b * KV + j) * (G + 2) * hd;
        float* kh = kc + b * row_stride + j * head_stride;
        float* vh = vc + b * row_stride + j * head_stride;
        float* kslot = kh + (int64_t)slot * hd;
        for (int i = 0; i < hd; ++i) vh[(int64_t)slot * hd + i] = src[i];
        for (int p = 0; p < 1 + G; ++p) {  // k, then the queries (scaled)
          const float* x = src + (1 + p) * hd;
          float* y = p == 0 ? kslot : qbuf.data() + (p - 1) * hd;
          const float m = p == 0 ? 1.f : scale;
          for (int i = 0; i < half; ++i) {
            float c = rot[2 * i], s = rot[2 * i + 1], a = x[2 * i], e = x[2 * i + 1];
            y[2 * i] = (a * c - e * s) * m;
            y[2 * i + 1] = (a * s + e * c) * m;
          }
        }
        const float* kfirst = kh + (int64_t)first * hd;
        const float* vfirst = vh + (int64_t)first * hd;
        float* ob = out + (int64_t)b * KV * G * hd + (int64_t)j * G * hd;
        int g = 0;
        for (; g + 2 <= G; g += 2)
          scores_pair(qbuf.data() + g * hd, qbuf.data() + (g + 1) * hd, kfirst,
                      scores.data() + g * n, scores.data() + (g + 1) * n, n, hd);
        for (; g < G; ++g) scores_row(qbuf.data() + g * hd, kfirst, scores.data() + g * n, n, hd);
        for (g = 0; g < G; ++g) {
          float* sc = scores.data() + g * n;
          float mx = sc[0];
          for (int t = 1; t < n; ++t) mx = sc[t] > mx ? sc[t] : mx;
          weighted_sum(sc, vfirst, ob + g * hd, n, hd, 1.f / exp_shift_sum(sc, n, mx));
        }
      }
    }
  });
}

// Each row's token and its log-probability under softmax(x / t): tok[r] = the first maximum of
// row r when pick (greedy; torch's argmax), else the given one; lp[r] = x[tok] / t - max / t -
// log(sum(exp(x / t - max / t))), log_softmax's formula, in two passes over the row instead of
// torch's argmax, log_softmax (which writes the whole [rows, vocab] output) and gather. Returns
// 1 when a row holds NaN or +-inf (nothing is to be trusted then: the caller takes torch's ops).
int meshrl_token_logprob(const float* x, int64_t* tok, float* lp, int rows, int vocab, float t,
                         int pick) {
  int bad = 0;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + (int64_t)r * vocab;
    float m = xr[0], total = 0.f;
#pragma omp simd reduction(max : m) reduction(+ : total)
    for (int i = 0; i < vocab; ++i) {
      m = xr[i] > m ? xr[i] : m;
      total += xr[i] * 0.f;  // 0 for finite values, NaN for NaN or +-inf
    }
    if (total != 0.f) {
      bad = 1;
      continue;
    }
    int64_t a = tok[r];
    if (pick) {
      a = 0;
      while (xr[a] != m) ++a;
      tok[r] = a;
    }
    const float ms = m / t;
    lp[r] = xr[a] / t - ms - std::log(exp_div_sum(xr, vocab, t, ms));
  }
  return bad;
}

// The replayable sampler's u for one decode step (sampling.py, docs/sampling.md): for row r and
// vocabulary id v, u = (m(key_r ^ vocab_hash[v]) + 0.5) / 2^32 with key_r = m(base[r] ^ position).
// Pure 32-bit integer arithmetic and two exact double operations (h < 2^32 needs 32 of the 53
// mantissa bits, the division is by a power of two), so every value equals torch's bit for bit.
static inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

void meshrl_gumbel_u(const int64_t* base, int64_t position, const int64_t* vocab_hash, double* u,
                     int rows, int vocab) {
  for (int r = 0; r < rows; ++r) {
    const uint32_t key = mix32((uint32_t)base[r] ^ (uint32_t)position);
    double* ur = u + (int64_t)r * vocab;
#pragma omp simd
    for (int v = 0; v < vocab; ++v)
      ur[v] = ((double)mix32(key ^ (uint32_t)vocab_hash[v]) + 0.5) / 4294967296.0;
  }
}

}  // extern "C"
