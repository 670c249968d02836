// InvariantLinear's tiles in plain C++ (16 scalar lanes, std::fma): the reference the vector
// versions must equal bit for bit, and the level for CPUs without AVX2.
#define MOEBATCH_INVARIANT_ISA portable
#include <cmath>
#include <cstring>

#include "cpu_attention/gemm/invariant_linear_internal.h"
#include "cpu_attention/gemm/invariant_linear_kernel.h"

namespace moebatch {
namespace invariant_linear_internal {
namespace portable {
namespace {

struct V {
  float v[16];
  static V Zero() { return V{}; }
  static V LoadX(const float* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = p[i];
    return r;
  }
  static void Store(float* p, const V& a) {
    for (int i = 0; i < 16; ++i) p[i] = a.v[i];
  }
  template <WForm WD>
  static V LoadW(const WElem<WD>* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = ScalarW<WD>(p + i);
    return r;
  }
  using Scale = float;
  static Scale ScaleQ8_0(const uint8_t* p) {
    uint16_t d;
    std::memcpy(&d, p, sizeof d);
    return F16ToF32(d);
  }
  static V LoadQ8_0(const uint8_t* p, int first, Scale d) {
    V r;
    for (int i = 0; i < 16; ++i)
      r.v[i] = d * static_cast<float>(static_cast<int8_t>(p[2 + first + i]));
    return r;
  }
  static V LoadOdd(const uint16_t* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = BF16ToF32(p[2 * i + 1]);
    return r;
  }
  static V LoadEven(const uint16_t* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = BF16ToF32(p[2 * i]);
    return r;
  }
  static V Fma(const V& a, const V& b, const V& acc) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = std::fma(a.v[i], b.v[i], acc.v[i]);
    return r;
  }
  static float Reduce(V a) { return TreeSum(a.v); }
};

}  // namespace
}  // namespace portable

TileFn PortableTile(WForm w_form) { return portable::TileFor<portable::V, 2, 2>(w_form); }

}  // namespace invariant_linear_internal
}  // namespace moebatch
