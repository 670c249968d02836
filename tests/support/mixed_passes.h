// Two forward passes that mix every kind of row the model runner handles, for the runner's tests
// (tests/engine/test_vslpipe.cc, tests/engine/test_device_prefill.cc). Five sequences over a cache of at least
// 23 blocks of 16 slots:
//   pass 1: whole prompts of 40 (sequence 0), 5 (1) and 9 (3) tokens, and the first 30 tokens of
//           sequence 2 (a chunk whose prompt continues: no logits);
//   pass 2: decode tokens of 0, 1 and 3, the remaining 12 tokens of 2 (a continued chunk), and a
//           new 17-token prompt (4).
// The 40-token prompt is longer than tiny-mixtral-swa's sliding window (32). Token ids are a
// cheap hash of (position, sequence), below vocab_size.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "engine/model_runner.h"

namespace moebatch::testing {

struct MixedPasses {
  std::vector<std::vector<int32_t>> tables;  // block tables the batches point into
  ForwardBatch first, second;
  int64_t first_tokens = 0, second_tokens = 0;
};

// Heap-allocated: the batches hold pointers to `tables`.
inline std::unique_ptr<MixedPasses> MakeMixedPasses(int64_t vocab_size) {
  auto m = std::make_unique<MixedPasses>();
  m->tables = {{3, 9, 10}, {4}, {12, 13, 14}, {20}, {21, 22}};
  auto ids = [&](int64_t n, int seed) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < n; ++i) {
      out.push_back(static_cast<int32_t>((i * 37 + seed * 101) % vocab_size));
    }
    return out;
  };
  int64_t row = 0;
  const std::pair<int, int64_t> pass1[] = {{0, 40}, {1, 5}, {2, 30}, {3, 9}};
  for (auto [s, n] : pass1) {
    auto t = ids(n, s);
    m->first.token_ids.insert(m->first.token_ids.end(), t.begin(), t.end());
    m->first.seqs.push_back(ForwardSequence{&m->tables[s], row, n, n, s != 2});
    row += n;
  }
  ForwardBatch& second = m->second;
  second.token_ids = {11, 22};
  second.seqs.push_back(ForwardSequence{&m->tables[0], 0, 1, 41, true});
  second.seqs.push_back(ForwardSequence{&m->tables[1], 1, 1, 6, true});
  auto rest = ids(12, 7);
  second.token_ids.insert(second.token_ids.end(), rest.begin(), rest.end());
  second.seqs.push_back(ForwardSequence{&m->tables[2], 2, 12, 42, true});
  auto fresh = ids(17, 8);
  second.token_ids.insert(second.token_ids.end(), fresh.begin(), fresh.end());
  second.seqs.push_back(ForwardSequence{&m->tables[4], 14, 17, 17, true});
  second.token_ids.push_back(33);
  second.seqs.push_back(ForwardSequence{&m->tables[3], 31, 1, 10, true});
  m->first_tokens = static_cast<int64_t>(m->first.token_ids.size());
  m->second_tokens = static_cast<int64_t>(second.token_ids.size());
  return m;
}

}  // namespace moebatch::testing
