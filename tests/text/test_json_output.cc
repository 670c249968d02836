// JSON mode's recognizer and vocabulary mask (engine/text/json_output.h): JSON texts whose
// top-level value is an object are accepted byte by byte (every prefix of one, and complete only
// at its end), everything else refused at the first byte that cannot continue one; the mask on the
// Mixtral tokenizer.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/text/json_output.h"
#include "engine/text/text_unicode.h"
#include "nlohmann/json.hpp"

namespace moebatch {
namespace {

// -1: every byte accepted; else the index of the first refused byte.
int Refused(const std::string& text, JsonPrefix* state_out = nullptr) {
  JsonPrefix state;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!state.Feed(static_cast<uint8_t>(text[i]))) return static_cast<int>(i);
  }
  if (state_out != nullptr) *state_out = state;
  return -1;
}

bool Complete(const std::string& text) {
  JsonPrefix state;
  return Refused(text, &state) == -1 && state.complete();
}

TEST_CASE("JsonPrefix accepts JSON objects, complete only at their end") {
  const std::vector<std::string> objects = {
      "{}",
      " \n{ }\t",
      R"({"a": 1})",
      R"({"a":[1,2.5,-0,-0.25e+10,3E-2,0e0],"b":{"c":null,"d":true,"e":false},"f":[]})",
      R"({"s": "q\"b\\s\/\b\f\n\r\t\u00e9\uD83D\uDE00 é 😀", "": ""})",
      R"({"deep": [[[[{"x": [{}]}]]]]})",
      "{\"k\" :\r\n\"v\" , \"n\": [ 1 , 2 ] }",
  };
  for (const std::string& o : objects) {
    INFO(o);
    REQUIRE(nlohmann::json::parse(o).is_object());  // the cases are JSON objects
    for (size_t n = 0; n < o.size(); ++n) {
      JsonPrefix state;
      REQUIRE(Refused(o.substr(0, n), &state) == -1);
      const bool closed = o.find_last_not_of(" \t\r\n") < n;
      CHECK(state.complete() == closed);
    }
    CHECK(Complete(o));
  }
}

TEST_CASE("JsonPrefix refuses what no JSON object continues, at the first wrong byte") {
  const std::vector<std::pair<std::string, int>> cases = {
      {"[1]", 0},  // the top level is an object
      {"\"a\"", 0},
      {"1", 0},
      {"x", 0},
      {"{a", 1},        // keys are strings
      {"{\"a\" 1", 5},  // a colon after the key
      {"{\"a\":}", 5},
      {"{\"a\":1,}", 7},  // no trailing comma
      {"{\"a\":01}", 6},  // no leading zeros
      {"{\"a\":1.}", 7},
      {"{\"a\":1e}", 7},
      {"{\"a\":-}", 6},
      {"{\"a\":+1}", 5},
      {"{\"a\":.5}", 5},
      {"{\"a\":tru}", 8},
      {"{\"a\":nul", -1},  // a prefix
      {"{\"a\":nulx", 8},
      {"{\"a\":[1 2]}", 8},
      {"{\"a\":[1,]}", 8},
      {"{\"a\":[}", 6},
      {"{\"a\":1]", 6},     // closes what is not open
      {"{\"a\\x\":1}", 4},  // unknown escape
      {"{\"a\\u12g4\":1}", 7},
      {"{\"a\nb\":1}", 3},  // control bytes must be escaped in strings
      {"{} {}", 3},         // one object
      {"{}x", 2},
  };
  for (const auto& [text, at] : cases) {
    INFO(text);
    CHECK(Refused(text) == at);
  }
}

TEST_CASE("JsonPrefix bounds nesting and runs of whitespace") {
  std::string deep = "{\"a\":";
  for (int d = 1; d < kMaxJsonDepth; ++d) deep += "[";
  CHECK(Refused(deep) == -1);
  CHECK(Refused(deep + "[") == static_cast<int>(deep.size()));
  const std::string ws(kMaxJsonWhitespace, ' ');
  CHECK(Refused("{" + ws + "}") == -1);
  CHECK(Refused("{" + ws + " }") == 1 + kMaxJsonWhitespace);
  CHECK(Complete("{}" + ws));
  CHECK(Refused("{\"" + std::string(1000, ' ') + "\":1}") == -1);  // not in strings
}

TEST_CASE("JsonPrefix agrees with nlohmann-json on random documents and their mutations") {
  std::mt19937 rng(7);
  auto value = [&](auto&& self, int depth) -> nlohmann::json {
    switch (std::uniform_int_distribution<int>(0, depth > 3 ? 3 : 5)(rng)) {
      case 0:
        return std::uniform_int_distribution<int>(-1000, 1000)(rng);
      case 1:
        return std::ldexp(std::uniform_real_distribution<double>(-1, 1)(rng),
                          std::uniform_int_distribution<int>(-80, 80)(rng));
      case 2:
        return std::string(std::uniform_int_distribution<int>(0, 5)(rng),
                           "a\"\\\n\x01"[rng() % 5]) +
               (rng() % 2 == 0 ? "é" : "");
      case 3:
        return nlohmann::json(rng() % 3 == 0 ? nlohmann::json() : nlohmann::json(rng() % 2 == 0));
      case 4: {
        nlohmann::json a = nlohmann::json::array();
        for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i) {
          a.push_back(self(self, depth + 1));
        }
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (int i = std::uniform_int_distribution<int>(0, 3)(rng); i > 0; --i) {
          o[std::string(1, static_cast<char>('a' + rng() % 26))] = self(self, depth + 1);
        }
        return o;
      }
    }
  };
  for (int trial = 0; trial < 300; ++trial) {
    nlohmann::json doc = nlohmann::json::object();
    doc["v"] = value(value, 1);
    const std::string text = doc.dump(trial % 2 == 0 ? -1 : 1);
    INFO(text);
    REQUIRE(Complete(text));
    // One byte changed: if the recognizer takes the whole text as a complete object, so must
    // nlohmann-json (the converse need not hold: "1" to "2" keeps both happy, as it should).
    std::string mutated = text;
    mutated[rng() % mutated.size()] = "{}[]\",:0-.eE tfn\\x"[rng() % 18];
    // (Not for the recognizer's documented leniencies: bytes that are not UTF-8 in a string, and
    // numbers beyond double's range, which JSON's grammar allows and nlohmann-json refuses.)
    const bool huge = mutated.find_first_of("eE") != std::string::npos;
    if (Complete(mutated) && IsValidUtf8(mutated) && !huge) {
      INFO(mutated);
      CHECK(nlohmann::json::parse(mutated, nullptr, false).is_object());
    }
  }
}

TEST_CASE("JsonTokenMask on the Mixtral tokenizer: text tokens only, EOS once closed") {
  auto tok =
      Tokenizer::Load(std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral/tokenizer.model", 1, 2);
  INFO(tok.status().ToString() << " (run scripts/fetch_tokenizer.sh)");
  REQUIRE(tok.ok());
  const Tokenizer& t = **tok;
  const JsonTokenMask mask(t, {2});
  const int64_t vocab = t.vocab_size();
  std::vector<float> logits(static_cast<size_t>(vocab), 0.0f);
  const JsonPrefix start;
  const int64_t left = mask.Apply(start, logits.data(), vocab);
  const int32_t brace = t.TokenToId("{");
  REQUIRE(brace >= 0);
  CHECK(std::isfinite(logits[brace]));
  CHECK(std::isinf(logits[2]));                    // EOS: not yet
  CHECK(std::isinf(logits[1]));                    // BOS: not text
  CHECK(std::isinf(logits[t.TokenToId("▁the")]));  // not JSON
  CHECK(left > 0);
  CHECK(left < vocab / 10);
  int64_t finite = 0;
  for (float v : logits) finite += std::isfinite(v) ? 1 : 0;
  CHECK(finite == left);

  // Each allowed token feeds; the others do not: at the start, inside a key (where plain string
  // tokens are taken without trying them), after a key, inside a number and in an escape.
  for (const std::string prefix : {"", "{\"", "{\"k\"", "{\"k\": -1", "{\"k\": \"a\\"}) {
    JsonPrefix state;
    REQUIRE(state.Feed(prefix));
    std::fill(logits.begin(), logits.end(), 0.0f);
    const int64_t n = mask.Apply(state, logits.data(), vocab);
    int64_t fed = 0;
    for (int32_t v = 0; v < vocab; ++v) {
      JsonPrefix s = state;
      const bool ok = mask.Advance(&s, v);
      fed += ok ? 1 : 0;
      if (ok != std::isfinite(logits[v])) FAIL_CHECK(prefix << ": token " << v);
    }
    CHECK(fed == n);
  }
  std::fill(logits.begin(), logits.end(), 0.0f);
  mask.Apply(start, logits.data(), vocab);

  JsonPrefix closed;
  REQUIRE(mask.Advance(&closed, brace));
  REQUIRE(mask.Advance(&closed, t.TokenToId("}")));
  REQUIRE(closed.complete());
  std::fill(logits.begin(), logits.end(), 0.0f);
  CHECK(mask.Apply(closed, logits.data(), vocab) == 1);
  CHECK(std::isfinite(logits[2]));
  // Past the vocabulary (a model's padded rows): masked.
  std::vector<float> padded(static_cast<size_t>(vocab) + 8, 0.0f);
  mask.Apply(start, padded.data(), vocab + 8);
  for (int64_t v = vocab; v < vocab + 8; ++v) CHECK(std::isinf(padded[v]));
}

}  // namespace
}  // namespace moebatch
