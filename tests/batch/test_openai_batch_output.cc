// OpenAI batch JSONL output and error lines (engine/batch/openai_batch.h): each output line is
// parsed back with nlohmann-json and checked field by field: chat.completion, text_completion and
// Response bodies, logprobs, n choices, harmony replies, error lines.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "engine/batch/openai_batch.h"
#include "engine/text/bpe_tokenizer_internal.h"  // BytesCharUtf8: the byte-level alphabet
#include "tests/batch/openai_batch_lines.h"

namespace moebatch {
namespace {

using json = nlohmann::json;
using test_lines::ChatLine;
using test_lines::CompletionLine;
using test_lines::Line;
using test_lines::ParseOk;
using test_lines::ResponsesLine;

// The envelope of a successful output line: its id and custom_id, no error, status 200, and the
// request id (the line id without "batch_"); returns response.body.
const json& CheckOkEnvelope(const json& line, const std::string& id, const std::string& custom_id) {
  CHECK(line["id"] == id);
  CHECK(line["custom_id"] == custom_id);
  CHECK(line["error"].is_null());
  CHECK(line["response"]["status_code"] == 200);
  CHECK(line["response"]["request_id"] == id.substr(std::string("batch_").size()));
  return line["response"]["body"];
}

TEST_CASE("custom_id is recovered when the body is invalid, and the error line is a 400") {
  ParsedBatchLine parsed = ParseBatchLine(
      R"({"custom_id": "job-42", "method": "POST", "url": "/v1/chat/completions",
          "body": {"messages": [{"role": "user", "content": "Hi"}], "temperature": -1}})");
  CHECK(parsed.json_ok);
  CHECK(parsed.custom_id == "job-42");
  REQUIRE_FALSE(parsed.request.ok());

  const json j = json::parse(FormatBatchError(parsed, "batch_req_abc", parsed.request.status()));
  CHECK(j["id"] == "batch_req_abc");
  CHECK(j["custom_id"] == "job-42");
  CHECK(j["error"].is_null());
  CHECK(j["response"]["status_code"] == 400);
  CHECK(j["response"]["request_id"] == "req_abc");
  const json& error = j["response"]["body"]["error"];
  CHECK(error["message"] == std::string(parsed.request.status().message()));
  CHECK(absl::StartsWith(error["message"].get<std::string>(), "body.temperature: "));
  CHECK(error["type"] == "invalid_request_error");
  CHECK(error["param"] == "body.temperature");
  CHECK(error["code"] == "invalid_argument");
}

TEST_CASE("A server-side failure gives a 500 error line") {
  ParsedBatchLine parsed = ParseBatchLine(ChatLine({}));
  REQUIRE(parsed.request.ok());
  const json j =
      json::parse(FormatBatchError(parsed, "batch_req_1", absl::InternalError("engine stopped")));
  CHECK(j["custom_id"] == "req-1");
  CHECK(j["response"]["status_code"] == 500);
  CHECK(j["response"]["body"]["error"]["type"] == "server_error");
  CHECK(j["response"]["body"]["error"]["param"].is_null());
  CHECK(j["response"]["body"]["error"]["message"] == "engine stopped");

  const json oor = json::parse(
      FormatBatchError(parsed, "batch_req_2", absl::OutOfRangeError("prompt: too long")));
  CHECK(oor["response"]["status_code"] == 400);
  CHECK(oor["response"]["body"]["error"]["param"] == "prompt");
  CHECK(oor["response"]["body"]["error"]["code"] == "out_of_range");
}

TEST_CASE("A chat completion output line parses back with the exact fields") {
  const BatchRequest request = ParseOk(ChatLine({{"max_tokens", 8}}));
  Completion c;
  c.text = "Hello \"there\"\nfriend \xE2\x9C\x93";
  c.token_ids = {22557, 736, 2};
  c.finish_reason = "stop";
  c.prompt_tokens = 11;
  c.completion_tokens = 3;
  const std::string out = FormatBatchOutput(request, "batch_req_0001", c, 1700000000);
  CHECK(out.find('\n') == std::string::npos);

  const json j = json::parse(out);
  const json& body = CheckOkEnvelope(j, "batch_req_0001", "req-1");
  CHECK(body["id"] == "chatcmpl-0001");
  CHECK(body["object"] == "chat.completion");
  CHECK(body["created"] == 1700000000);
  CHECK(body["model"] == "mixtral");
  REQUIRE(body["choices"].size() == 1);
  const json& choice = body["choices"][0];
  CHECK(choice["index"] == 0);
  CHECK(choice["message"]["role"] == "assistant");
  CHECK(choice["message"]["content"] == c.text);
  CHECK_FALSE(choice.contains("text"));
  CHECK(choice["finish_reason"] == "stop");
  CHECK(choice["logprobs"].is_null());
  CHECK(choice["token_ids"].get<std::vector<int32_t>>() == c.token_ids);
  CHECK(body["usage"]["prompt_tokens"] == 11);
  CHECK(body["usage"]["completion_tokens"] == 3);
  CHECK(body["usage"]["total_tokens"] == 14);
}

TEST_CASE("A text completion output line parses back with the exact fields") {
  const BatchRequest request = ParseOk(CompletionLine({}));
  Completion c;
  c.text = " there was a";
  c.token_ids = {736, 403, 264};
  c.finish_reason = "length";
  c.prompt_tokens = 5;
  c.completion_tokens = 3;
  const json j = json::parse(FormatBatchOutput(request, "batch_req_x", c, 42));
  const json& body = CheckOkEnvelope(j, "batch_req_x", "req-1");
  CHECK(body["id"] == "cmpl-x");
  CHECK(body["object"] == "text_completion");
  CHECK(body["created"] == 42);
  const json& choice = body["choices"][0];
  CHECK(choice["text"] == " there was a");
  CHECK_FALSE(choice.contains("message"));
  CHECK(choice["finish_reason"] == "length");
  CHECK(choice["logprobs"].is_null());
  CHECK(choice["token_ids"].get<std::vector<int32_t>>() == c.token_ids);
  CHECK(body["usage"]["total_tokens"] == 8);
}

TEST_CASE("Invalid UTF-8 in generated text does not throw and still gives valid JSON") {
  const BatchRequest request = ParseOk(ChatLine({}));
  Completion c;
  c.text = "ok \xE2\x9C then \xff\xfe end \xC3";  // truncated, stray and dangling bytes
  c.token_ids = {1};
  c.finish_reason = "length";
  std::string out;
  REQUIRE_NOTHROW(out = FormatBatchOutput(request, "batch_req_u", c, 0));
  json j;
  REQUIRE_NOTHROW(j = json::parse(out));
  const std::string content = j["response"]["body"]["choices"][0]["message"]["content"];
  CHECK(absl::StartsWith(content, "ok "));
  CHECK(content.find("\xEF\xBF\xBD") != std::string::npos);  // U+FFFD
  CHECK(absl::StrContains(content, " end "));

  ParsedBatchLine bad;
  bad.json_ok = true;
  bad.custom_id = "id-\xff";
  REQUIRE_NOTHROW(
      j = json::parse(FormatBatchError(bad, "batch_req_v", absl::InvalidArgumentError("x\xff"))));
  CHECK(j["custom_id"] == "id-\xEF\xBF\xBD");
}

// Two choices with logprobs, formatted with the tiny Mixtral's sentencepiece tokenizer (ids 1 and
// 2 are <s> and </s>; 28705 is "▁"; 28740 "1"; byte piece 13 is <0x0A>).
TEST_CASE("n choices and logprobs in chat and completion output lines") {
  auto tok =
      Tokenizer::Load(std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral/tokenizer.model", 1, 2);
  INFO(tok.status().ToString() << " (run scripts/fetch_tokenizer.sh)");
  REQUIRE(tok.ok());
  const int32_t space = (*tok)->TokenToId("\xE2\x96\x81");  // "▁"
  REQUIRE(space > 0);
  REQUIRE((*tok)->TokenBytes(space) == " ");
  REQUIRE((*tok)->TokenBytes(13) == "\n");  // <0x0A>
  std::vector<Completion> choices(2);
  choices[0].text = " \n";
  choices[0].token_ids = {space, 13};
  choices[0].logprobs = {{space, -0.5f, {{space, -0.5f}, {13, -1.25f}}},
                         {13, -2.0f, {{space, -0.25f}, {2, -1.0f}}}};
  choices[0].finish_reason = "length";
  choices[0].prompt_tokens = 4;
  choices[0].completion_tokens = 2;
  choices[1] = choices[0];
  choices[1].text = "";
  choices[1].token_ids = {2};
  choices[1].logprobs = {{2, -3.0f, {{space, -0.125f}, {13, -0.75f}}}};
  choices[1].finish_reason = "stop";
  choices[1].completion_tokens = 1;

  SECTION("chat: content entries with token, logprob, bytes, top_logprobs") {
    const BatchRequest request =
        ParseOk(ChatLine({{"n", 2}, {"logprobs", true}, {"top_logprobs", 2}}));
    const json j = json::parse(FormatBatchOutput(request, "batch_req_c", choices, 7, tok->get()));
    const json& body = j["response"]["body"];
    REQUIRE(body["choices"].size() == 2);
    CHECK(body["choices"][0]["index"] == 0);
    CHECK(body["choices"][1]["index"] == 1);
    CHECK(body["choices"][1]["finish_reason"] == "stop");
    CHECK(body["usage"]["prompt_tokens"] == 4);
    CHECK(body["usage"]["completion_tokens"] == 3);  // summed over the choices
    CHECK(body["usage"]["total_tokens"] == 7);
    const json& lp = body["choices"][0]["logprobs"];
    CHECK(lp["refusal"].is_null());
    REQUIRE(lp["content"].size() == 2);
    const json& first = lp["content"][0];
    CHECK(first["token"] == " ");
    CHECK(first["logprob"].get<double>() == -0.5);
    CHECK(first["bytes"] == json::array({32}));
    REQUIRE(first["top_logprobs"].size() == 2);
    CHECK(first["top_logprobs"][1]["token"] == "\n");
    CHECK(first["top_logprobs"][1]["logprob"].get<double>() == -1.25);
    CHECK(first["top_logprobs"][1]["bytes"] == json::array({10}));
    CHECK(first["top_logprobs"][0].size() == 3);  // token, logprob, bytes
    const json& eos = body["choices"][1]["logprobs"]["content"][0];
    CHECK(eos["token"] == "</s>");
    CHECK(eos["logprob"].get<double>() == -3.0);
  }
  SECTION(
      "completions: tokens, token_logprobs, top_logprobs (with the sampled token), text_offset") {
    const BatchRequest request = ParseOk(CompletionLine({{"n", 2}, {"logprobs", 1}}));
    const json j = json::parse(FormatBatchOutput(request, "batch_req_t", choices, 7, tok->get()));
    const json& lp = j["response"]["body"]["choices"][0]["logprobs"];
    CHECK(lp["tokens"] == json::array({" ", "\n"}));
    CHECK(lp["token_logprobs"] == json::array({-0.5, -2.0}));
    CHECK(lp["text_offset"] == json::array({0, 1}));
    REQUIRE(lp["top_logprobs"].size() == 2);
    CHECK(lp["top_logprobs"][0] == json({{" ", -0.5}, {"\n", -1.25}}));
    // The sampled "\n" is not among the top entries given: it is added.
    CHECK(lp["top_logprobs"][1] == json({{" ", -0.25}, {"</s>", -1.0}, {"\n", -2.0}}));
    CHECK(j["response"]["body"]["choices"][1]["logprobs"]["tokens"] == json::array({"</s>"}));
  }
  SECTION("without logprobs asked, choice.logprobs is null") {
    const BatchRequest request = ParseOk(ChatLine({{"n", 2}}));
    const json j = json::parse(FormatBatchOutput(request, "batch_req_n", choices, 7, tok->get()));
    CHECK(j["response"]["body"]["choices"][0]["logprobs"].is_null());
    CHECK(j["response"]["body"]["choices"][1]["logprobs"].is_null());
  }
}

// A byte-level tokenizer.json with one token per byte (no merges) and the harmony special tokens
// as special added tokens, in a temporary directory; loaded with the chat layout `layout`.
std::unique_ptr<Tokenizer> HarmonyVocabTokenizer(const std::string& layout) {
  namespace fs = std::filesystem;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bpe_internal::BytesCharUtf8()[b]] = b;
  json added = json::array();
  int id = 256;
  for (const char* t : {"<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                        "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"}) {
    added.push_back({{"id", id++},
                     {"content", t},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const json doc = {{"version", "1.0"},
                    {"added_tokens", added},
                    {"normalizer", nullptr},
                    {"pre_tokenizer",
                     {{"type", "ByteLevel"},
                      {"add_prefix_space", false},
                      {"trim_offsets", true},
                      {"use_regex", false}}},
                    {"post_processor", nullptr},
                    {"decoder",
                     {{"type", "ByteLevel"},
                      {"add_prefix_space", true},
                      {"trim_offsets", true},
                      {"use_regex", true}}},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", false},
                      {"vocab", vocab},
                      {"merges", json::array()}}}};
  const fs::path dir =
      fs::temp_directory_path() / ("moebatch_harmony_vocab_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << doc.dump();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::LoadFromModelDir(dir.string(), std::nullopt, std::nullopt, layout);
  fs::remove_all(dir);
  INFO(tok.status().ToString());
  REQUIRE(tok.ok());
  return *std::move(tok);
}

TEST_CASE("A harmony model's chat reply: the final channel as content, analysis as reasoning") {
  const std::unique_ptr<Tokenizer> harmony = HarmonyVocabTokenizer("harmony");
  REQUIRE(harmony->chat_layout_name() == "harmony");
  const BatchRequest chat = ParseOk(ChatLine(nullptr));
  auto reply = [&](const Tokenizer& tok, const std::string& raw, const BatchRequest& request) {
    Completion c;
    c.token_ids = tok.Encode(raw, EncodeOptions{false, true});
    c.text = tok.Decode(c.token_ids);
    c.finish_reason = "stop";
    const json j = json::parse(FormatBatchOutput(request, "batch_req_h", {c}, 7, &tok));
    return j["response"]["body"]["choices"][0];
  };
  const std::string raw =
      "<|channel|>analysis<|message|>2+2=4, simple.<|end|><|start|>assistant<|channel|>final"
      "<|message|>**4** ✓<|return|>";
  const json choice = reply(*harmony, raw, chat);
  CHECK(choice["message"] == json({{"role", "assistant"},
                                   {"content", "**4** ✓"},
                                   {"reasoning_content", "2+2=4, simple."}}));
  CHECK(choice["token_ids"].back() == 258);  // <|return|>
  // Cut inside the analysis (max_tokens): reasoning only, content null.
  const json cut = reply(*harmony, "<|channel|>analysis<|message|>Let me think", chat);
  CHECK(cut["message"]["content"].is_null());
  CHECK(cut["message"]["reasoning_content"] == "Let me think");
  // Completions are text as before; so is the chat reply of another layout.
  const json text = reply(*harmony, raw, ParseOk(CompletionLine(nullptr)));
  CHECK(text["text"] == "analysis2+2=4, simple.assistantfinal**4** ✓");
  const std::unique_ptr<Tokenizer> chatml = HarmonyVocabTokenizer("chatml");
  const json plain = reply(*chatml, raw, chat);
  CHECK(plain["message"] ==
        json({{"role", "assistant"}, {"content", "analysis2+2=4, simple.assistantfinal**4** ✓"}}));
}

TEST_CASE("A /v1/responses output line is OpenAI's Response object") {
  Completion c;
  c.text = "Hello!";
  c.token_ids = {22557, 28808, 2};
  c.finish_reason = "stop";
  c.prompt_tokens = 12;
  c.completion_tokens = 3;
  const BatchRequest request = ParseOk(ResponsesLine(
      {{"instructions", "Be brief."}, {"max_output_tokens", 64}, {"temperature", 0.7}}));
  const json line = json::parse(FormatBatchOutput(request, "batch_req_r1", c, 1700000000));
  const json& body = CheckOkEnvelope(line, "batch_req_r1", "req-1");
  CHECK(body["id"] == "resp_r1");
  CHECK(body["object"] == "response");
  CHECK(body["created_at"] == 1700000000);
  CHECK(body["status"] == "completed");
  CHECK(body["error"].is_null());
  CHECK(body["incomplete_details"].is_null());
  CHECK(body["instructions"] == "Be brief.");
  CHECK(body["max_output_tokens"] == 64);
  CHECK(body["model"] == "mixtral");
  CHECK(line.dump().find("\"temperature\":0.7,") != std::string::npos);  // the float, echoed
  CHECK(body["top_p"] == 1.0);
  CHECK(body["tools"] == json::array());
  CHECK(body["text"] == json({{"format", {{"type", "text"}}}}));
  CHECK(body["output"] ==
        json::array(
            {{{"id", "msg_r1"},
              {"type", "message"},
              {"status", "completed"},
              {"role", "assistant"},
              {"content",
               {{{"type", "output_text"}, {"text", "Hello!"}, {"annotations", json::array()}}}}}}));
  CHECK(body["usage"] ==
        json({{"input_tokens", 12},
              {"input_tokens_details", {{"cached_tokens", 0}, {"cache_write_tokens", 0}}},
              {"output_tokens", 3},
              {"output_tokens_details", {{"reasoning_tokens", 0}}},
              {"total_tokens", 15}}));
  CHECK(body["token_ids"] == json({22557, 28808, 2}));

  SECTION("cut by max_output_tokens: incomplete, with the reason") {
    c.finish_reason = "length";
    const json cut =
        json::parse(FormatBatchOutput(request, "batch_req_r2", c, 1))["response"]["body"];
    CHECK(cut["status"] == "incomplete");
    CHECK(cut["incomplete_details"] == json({{"reason", "max_output_tokens"}}));
    CHECK(cut["output"][0]["status"] == "incomplete");
  }
  SECTION("more than one choice cannot be a response") {
    const json bad = json::parse(FormatBatchOutput(request, "batch_req_r3", {c, c}, 1, nullptr));
    CHECK(bad["response"].is_null());
    CHECK(bad["error"]["code"] == "internal");
  }
}

TEST_CASE("A /v1/responses output's logprobs and a harmony model's reasoning item") {
  auto tok =
      Tokenizer::Load(std::string(MOEBATCH_FIXTURES_DIR) + "/tiny-mixtral/tokenizer.model", 1, 2);
  INFO(tok.status().ToString() << " (run scripts/fetch_tokenizer.sh)");
  REQUIRE(tok.ok());
  Completion c;
  c.text = "\n";
  c.token_ids = {13};
  c.logprobs = {{13, -2.0f, {{13, -2.0f}, {2, -1.0f}}}};
  c.finish_reason = "stop";
  c.prompt_tokens = 2;
  c.completion_tokens = 1;
  const BatchRequest request = ParseOk(ResponsesLine({{"top_logprobs", 2}}));
  const json body = json::parse(
      FormatBatchOutput(request, "batch_req_l", {c}, 7, tok->get()))["response"]["body"];
  CHECK(body["top_logprobs"] == 2);
  CHECK(body["output"][0]["content"][0]["logprobs"] ==
        json::array({{{"token", "\n"},
                      {"logprob", -2.0},
                      {"bytes", {10}},
                      {"top_logprobs",
                       {{{"token", "\n"}, {"logprob", -2.0}, {"bytes", {10}}},
                        {{"token", "</s>"}, {"logprob", -1.0}, {"bytes", {60, 47, 115, 62}}}}}}}));

  const std::unique_ptr<Tokenizer> harmony = HarmonyVocabTokenizer("harmony");
  auto reply = [&](const std::string& raw, const std::string& finish) {
    Completion h;
    h.token_ids = harmony->Encode(raw, EncodeOptions{false, true});
    h.text = harmony->Decode(h.token_ids);
    h.finish_reason = finish;
    return json::parse(FormatBatchOutput(ParseOk(ResponsesLine(nullptr)), "batch_req_g", {h}, 7,
                                         harmony.get()))["response"]["body"];
  };
  const json done = reply(
      "<|channel|>analysis<|message|>2+2=4, simple.<|end|><|start|>assistant<|channel|>final"
      "<|message|>**4** ✓<|return|>",
      "stop");
  REQUIRE(done["output"].size() == 2);
  CHECK(done["output"][0] ==
        json({{"id", "rs_g"},
              {"type", "reasoning"},
              {"summary", json::array()},
              {"content", {{{"type", "reasoning_text"}, {"text", "2+2=4, simple."}}}},
              {"status", "completed"}}));
  CHECK(done["output"][1]["content"][0]["text"] == "**4** ✓");
  // Cut inside the analysis: the reasoning item alone, incomplete.
  const json cut = reply("<|channel|>analysis<|message|>Let me think", "length");
  REQUIRE(cut["output"].size() == 1);
  CHECK(cut["output"][0]["type"] == "reasoning");
  CHECK(cut["output"][0]["status"] == "incomplete");
  CHECK(cut["status"] == "incomplete");
}

}  // namespace
}  // namespace moebatch
