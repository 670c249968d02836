// OutputText (engine/text/output_text.h): what a generating sequence releases, token by token,
// with stop strings, over the real Mixtral tokenizer.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "engine/text/output_text.h"
#include "engine/text/tokenizer.h"

namespace moebatch {
namespace {

const Tokenizer& Mixtral() {
  static const absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::Load(std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral/tokenizer.model", 1, 2);
  if (!tok.ok()) FAIL("cannot load the Mixtral tokenizer: " << tok.status().ToString());
  return **tok;
}

// Feeds the tokens of `text` one by one, the last with last=true; returns the deltas released
// after each token and whether (and after which token) a stop string ended the text.
struct Run {
  std::vector<std::string> deltas;
  int stopped_at = -1;
  std::string all() const {
    std::string s;
    for (const std::string& d : deltas) s += d;
    return s;
  }
};
Run Generate(const std::string& text, std::vector<std::string> stop) {
  const Tokenizer& tok = Mixtral();
  const std::vector<int32_t> ids = tok.Encode(text, /*add_bos=*/false);
  OutputText out(tok, std::move(stop));
  Run run;
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool last = i + 1 == ids.size();
    const bool stopped = out.Add(ids[i], last);
    std::string delta;
    out.Release(stopped || last, &delta);
    run.deltas.push_back(delta);
    if (stopped) {
      run.stopped_at = static_cast<int>(i);
      break;
    }
  }
  return run;
}

TEST_CASE("output text: without stop strings every token's text is released at once") {
  const Run run = Generate("Hello world, how are you?", {});
  CHECK(run.stopped_at == -1);
  CHECK(run.all() == "Hello world, how are you?");
  CHECK(run.deltas.front() == "Hello");
}

TEST_CASE("output text: the text is cut before the stop string, which is not released") {
  const Run run = Generate("The answer is 42. END of the story", {"END"});
  REQUIRE(run.stopped_at >= 0);
  CHECK(run.all() == "The answer is 42. ");
  // The earliest of several stop strings wins, wherever it is in the list.
  CHECK(Generate("one two three four", {"four", "two"}).all() == "one ");
}

TEST_CASE("output text: a tail that may begin a stop string is held back, then released") {
  // "STOP" never comes: "ST" is held back while it could, and comes out at the end.
  const Run run = Generate("abc ST xyz", {"STOP"});
  CHECK(run.stopped_at == -1);
  CHECK(run.all() == "abc ST xyz");
  for (size_t i = 0; i + 1 < run.deltas.size(); ++i) {
    std::string so_far;
    for (size_t j = 0; j <= i; ++j) so_far += run.deltas[j];
    // Never more released than the text less (4 - 1) bytes.
    CHECK(so_far.size() + 3 <= std::string("abc ST xyz").size());
  }
}

TEST_CASE("output text: a release never splits a UTF-8 character") {
  const std::string text = "naïve café — 東京 ok";
  const Run run = Generate(text, {"zzzz"});
  CHECK(run.all() == text);
  for (const std::string& d : run.deltas) {
    if (d.empty()) continue;
    CHECK((static_cast<unsigned char>(d.front()) & 0xC0) != 0x80);  // starts at a character
  }
}

}  // namespace
}  // namespace moebatch
