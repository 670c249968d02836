// Chat layouts (engine/text/chat_layout.h) against transformers'
// apply_chat_template(tokenize=False) on the real chat templates, and template recognition on every
// real template fetched.
//
// The templates and the reference texts are third-party data and are not in git:
// scripts/fetch_chat_templates.sh (tests/fixtures/make_chat_cases.py) writes them to
// .deps/chat_templates/ ($MOEBATCH_DEPS_DIR/chat_templates when that is set). Without them the
// tests that need them fail, naming the script.

#include <catch2/catch.hpp>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/text/chat_layout.h"

namespace moebatch {
namespace {

using json = nlohmann::json;

constexpr ChatLayout kAllLayouts[] = {
    ChatLayout::kChatML,      ChatLayout::kChatMLQwen15,  ChatLayout::kChatMLQwen25,
    ChatLayout::kChatMLQwen3, ChatLayout::kChatMLSmolLM2, ChatLayout::kLlama3,
    ChatLayout::kLlama31,     ChatLayout::kLlama32,       ChatLayout::kHarmony,
};
constexpr char kNameList[] =
    "chatml, qwen1.5, qwen2.5, qwen3, smollm2, llama3, llama3.1, llama3.2, harmony";

std::string ChatDir() {
  const char* deps = std::getenv("MOEBATCH_DEPS_DIR");
  if (deps != nullptr && *deps != '\0') return std::string(deps) + "/chat_templates";
  return std::string(MOEBATCH_FIXTURES_DIR) + "/../../.deps/chat_templates";
}

// A file of the generated data; fails the calling test when it is not there.
std::string ReadGenerated(const std::string& relative) {
  const std::string path = ChatDir() + "/" + relative;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    FAIL("missing " << path
                    << ": scripts/fetch_chat_templates.sh makes it (it runs "
                       "tests/fixtures/make_chat_cases.py; scripts/test.sh calls it)");
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<json> ReadJsonl(const std::string& relative) {
  std::vector<json> lines;
  std::istringstream in(ReadGenerated(relative));
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(json::parse(line));
  }
  if (lines.empty()) FAIL(ChatDir() << "/" << relative << " is empty");
  return lines;
}

// strftime(format) of the local time in the C locale: what the llama3.2 ("%d %b %Y") and harmony
// ("%Y-%m-%d") layouts write without a date_string.
std::string Today(const char* format = "%d %b %Y") {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[32];
  std::strftime(buf, sizeof buf, format, &local);
  return buf;
}

std::vector<ChatMessage> Messages(const json& j) {
  std::vector<ChatMessage> messages;
  for (const json& m : j) {
    messages.push_back({m.at("role").get<std::string>(), m.at("content").get<std::string>()});
  }
  return messages;
}

ChatMessage S(std::string c) { return {"system", std::move(c)}; }
ChatMessage U(std::string c) { return {"user", std::move(c)}; }
ChatMessage A(std::string c) { return {"assistant", std::move(c)}; }

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + to.size())) {
    s->replace(at, from.size(), to);
  }
}

TEST_CASE("RenderChat equals transformers' apply_chat_template text on every case") {
  const std::vector<json> lines = ReadJsonl("chat_cases.jsonl");
  const std::string today = Today();
  const std::string today_iso = Today("%Y-%m-%d");
  std::map<std::string, std::pair<int, int>> per_template;  // matched, cases
  for (const json& c : lines) {
    if (c.value("kind", "") == "meta") continue;
    const std::string tmpl = c.at("template").get<std::string>();
    const std::string name = c.at("layout").get<std::string>();
    const bool add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    INFO(tmpl << ", " << c.at("conversation").get<std::string>() << ", add_generation_prompt="
              << add_generation_prompt << ", options=" << c.at("options").dump());
    const std::optional<ChatLayout> layout = ChatLayoutFromName(name);
    REQUIRE(layout.has_value());
    ChatTemplateOptions options;
    const json& opts = c.at("options");
    if (opts.contains("enable_thinking")) options.enable_thinking = opts["enable_thinking"];
    if (opts.contains("date_string")) options.date_string = opts["date_string"].get<std::string>();
    if (opts.contains("model_identity")) {
      options.model_identity = opts["model_identity"].get<std::string>();
    }
    if (opts.contains("reasoning_effort")) {
      options.reasoning_effort = opts["reasoning_effort"].get<std::string>();
    }

    const absl::StatusOr<std::string> text =
        RenderChat(*layout, Messages(c.at("messages")), add_generation_prompt, options);
    bool matched;
    if (c.contains("error")) {
      // transformers raised (an empty conversation; harmony: channel tags in an assistant
      // content): RenderChat refuses it, naming the message.
      INFO("transformers: " << c["error"].get<std::string>());
      CHECK_FALSE(text.ok());
      const std::string want = c.at("messages").empty() ? "messages[0]: missing" : "messages[";
      matched = !text.ok() && text.status().code() == absl::StatusCode::kInvalidArgument &&
                text.status().message().rfind(want, 0) == 0;
      CHECK(matched);
    } else {
      std::string expected = c.at("expected").get<std::string>();
      if (c.contains("today")) {  // rendered on another day than this run
        ReplaceAll(&expected, "Today Date: " + c["today"].get<std::string>() + "\n",
                   "Today Date: " + today + "\n");
        ReplaceAll(&expected, "Current date: " + c["today"].get<std::string>() + "\n",
                   "Current date: " + today_iso + "\n");
      }
      REQUIRE(text.ok());
      matched = *text == expected;
      CHECK(*text == expected);
    }
    std::pair<int, int>& count = per_template[tmpl];
    count.first += matched ? 1 : 0;
    count.second += 1;
  }
  REQUIRE(per_template.size() >= 10);
  for (const auto& [tmpl, count] : per_template) {
    std::cout << "chat cases matched: " << count.first << "/" << count.second << "  " << tmpl
              << "\n";
  }
}

TEST_CASE("RecogniseChatTemplate recognises each real template and refuses the others") {
  const std::vector<json> manifest = ReadJsonl("templates.jsonl");
  int recognised = 0, refused = 0;
  for (const json& entry : manifest) {
    const std::string file = entry.at("file").get<std::string>();
    INFO(file);
    const absl::StatusOr<ChatLayout> layout =
        RecogniseChatTemplate(ReadGenerated("templates/" + file));
    if (entry.at("layout").is_string()) {
      REQUIRE(layout.ok());
      CHECK(std::string(ChatLayoutName(*layout)) == entry["layout"].get<std::string>());
      ++recognised;
    } else {
      INFO((layout.ok() ? std::string("recognised as ") + ChatLayoutName(*layout)
                        : std::string(layout.status().message())));
      REQUIRE_FALSE(layout.ok());
      CHECK(layout.status().code() == absl::StatusCode::kInvalidArgument);
      CHECK(std::string(layout.status().message()).find("give --chat_template NAME") !=
            std::string::npos);
      ++refused;
    }
  }
  std::cout << "real templates: " << recognised << " recognised, " << refused << " refused\n";
  CHECK(recognised == 10);
  CHECK(refused > 50);
}

TEST_CASE("recognition does not depend on formatting") {
  // Qwen3's template written differently: no whitespace control, subscripts for attributes,
  // double quotes, spaces around operators, a comment, a trailing newline (chat_template.jinja).
  std::string qwen3 = ReadGenerated("templates/llama.cpp/Qwen-Qwen3-0.6B.jinja");
  ReplaceAll(&qwen3, "{%- ", "{% ");
  ReplaceAll(&qwen3, " -%}", " %}");
  ReplaceAll(&qwen3, "{{- ", "{{ ");
  ReplaceAll(&qwen3, "message.role", "message['role']");
  ReplaceAll(&qwen3, "message.content", "message[\"content\"]");
  ReplaceAll(&qwen3, "'<|im_start|>'", "\"<|im_start|>\"");
  ReplaceAll(&qwen3, "==", " == ");
  qwen3 = "{# reformatted #}\n" + qwen3 + "\n";
  const absl::StatusOr<ChatLayout> q = RecogniseChatTemplate(qwen3);
  INFO(q.status().ToString());
  REQUIRE(q.ok());
  CHECK(*q == ChatLayout::kChatMLQwen3);

  // SmolLM2's template holds real newlines in its literals (as tokenizer_config.json decodes);
  // the same template with "\n" escapes is the same template.
  std::string smol = ReadGenerated("templates/gguf/HuggingFaceTB-SmolLM2-135M-Instruct.jinja");
  REQUIRE(smol.find('\n') != std::string::npos);
  ReplaceAll(&smol, "\n", "\\n");
  const absl::StatusOr<ChatLayout> s = RecogniseChatTemplate(smol);
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  CHECK(*s == ChatLayout::kChatMLSmolLM2);
  CHECK(CanonicalChatTemplate("{{- message['content'] + \"a\\nb\" -}}") ==
        "{{message.content+'a\\nb'}}");
  CHECK(CanonicalChatTemplate("x {# c #} {% if a and not b %}y{% endif %}\n") ==
        "{{'x '}}{%if a and not b%}{{'y'}}{%endif%}");
}

TEST_CASE("templates that differ from the known ones are refused, naming --chat_template") {
  const std::string tail = "); give --chat_template NAME with one of: " + std::string(kNameList);
  auto refusal = [](const std::string& text) {
    const absl::StatusOr<ChatLayout> r = RecogniseChatTemplate(text);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  CHECK(refusal("{% for m in messages %}<<{{ m.role }}>> {{ m.content }}\n{% endfor %}") ==
        "chat_template: not a template moebatch recognises (it shares no part with the templates "
        "moebatch lays out" +
            tail);
  CHECK(refusal("") ==
        "chat_template: not a template moebatch recognises (the template is empty" + tail);
  // Plain ChatML with a BOS first: not the chatml layout's text.
  CHECK(refusal("{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + "
                "'\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
                "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}") ==
        "chat_template: not a template moebatch recognises (closest: chatml, whose template it "
        "extends" +
            tail);
  // Qwen2.5 base models' template: the same but for the default system prompt.
  std::string qwen25_base = ReadGenerated("templates/llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja");
  ReplaceAll(&qwen25_base, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
             "You are a helpful assistant.");
  const std::string message = refusal(qwen25_base);
  CHECK(message.rfind("chat_template: not a template moebatch recognises (closest: qwen2.5, but "
                      "it lacks {%if messages[0].role=='system'%}",
                      0) == 0);
  CHECK(message.find(tail) != std::string::npos);
  // gpt-oss's template with another default reasoning effort: not harmony's text.
  std::string gpt_oss = ReadGenerated("templates/llama.cpp/openai-gpt-oss-120b.jinja");
  REQUIRE(RecogniseChatTemplate(gpt_oss).ok());
  ReplaceAll(&gpt_oss, "{%- set reasoning_effort = \"medium\" %}",
             "{%- set reasoning_effort = \"high\" %}");
  CHECK(refusal(gpt_oss).rfind(
            "chat_template: not a template moebatch recognises (closest: harmony, but it lacks "
            "{%macro build_system_message()%}",
            0) == 0);
}

TEST_CASE("layout names") {
  for (ChatLayout layout : kAllLayouts) {
    const std::optional<ChatLayout> back = ChatLayoutFromName(ChatLayoutName(layout));
    REQUIRE(back.has_value());
    CHECK(*back == layout);
  }
  CHECK(ChatLayoutNameList() == kNameList);
  CHECK_FALSE(ChatLayoutFromName("Qwen3").has_value());
  CHECK_FALSE(ChatLayoutFromName("llama3.3").has_value());
  CHECK_FALSE(ChatLayoutFromName("").has_value());
}

TEST_CASE("RenderChat refuses unknown roles, empty conversations and non-UTF-8 content") {
  for (ChatLayout layout : kAllLayouts) {
    INFO(ChatLayoutName(layout));
    auto error = [&](const std::vector<ChatMessage>& messages) {
      const absl::StatusOr<std::string> r = RenderChat(layout, messages, true);
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
      return std::string(r.status().message());
    };
    CHECK(error({S("s"), U("u"), {"tool", "42"}}) ==
          "messages[2].role: 'tool' is not one of system, user, assistant");
    CHECK(error({{"User", "u"}}) ==
          "messages[0].role: 'User' is not one of system, user, assistant");
    CHECK(error({U("u"), {"", "x"}}) ==
          "messages[1].role: '' is not one of system, user, assistant");
    CHECK(error({}) == "messages[0]: missing (an empty conversation)");
    CHECK(error({U("ok"), A("bad \xC3\x28 byte")}) == "messages[1].content: not valid UTF-8");
    CHECK(error({U("\xED\xA0\x80 surrogate")}) == "messages[0].content: not valid UTF-8");
  }
}

TEST_CASE("RenderChat: the layouts' options") {
  const std::vector<ChatMessage> chat = {U("hi")};
  ChatTemplateOptions no_thinking;
  no_thinking.enable_thinking = false;
  CHECK(*RenderChat(ChatLayout::kChatMLQwen3, chat, true, no_thinking) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // Only qwen3 reads enable_thinking; only the llama3.1/3.2 layouts read date_string.
  CHECK(*RenderChat(ChatLayout::kChatMLQwen25, chat, true, no_thinking) ==
        *RenderChat(ChatLayout::kChatMLQwen25, chat, true));
  ChatTemplateOptions dated;
  dated.date_string = "";
  CHECK(RenderChat(ChatLayout::kLlama31, chat, false, dated)->find("Today Date: \n\n") !=
        std::string::npos);
  CHECK(RenderChat(ChatLayout::kLlama32, chat, false)->find("Today Date: " + Today() + "\n\n") !=
        std::string::npos);
  CHECK(*RenderChat(ChatLayout::kLlama3, chat, false, dated) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>");

  // harmony: today's date by default; date_string, model_identity and reasoning_effort as given
  // (only harmony reads the last two).
  const std::string system_tail =
      "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every "
      "message.<|end|>";
  CHECK(*RenderChat(ChatLayout::kHarmony, chat, true) ==
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: " +
            Today("%Y-%m-%d") + "\n\nReasoning: medium" + system_tail +
            "<|start|>user<|message|>hi<|end|><|start|>assistant");
  ChatTemplateOptions harmony;
  harmony.date_string = "2030-02-03";
  harmony.model_identity = "";
  harmony.reasoning_effort = "high";
  CHECK(*RenderChat(ChatLayout::kHarmony, {S(""), U("hi"), A("a")}, false, harmony) ==
        "<|start|>system<|message|>\nKnowledge cutoff: 2024-06\nCurrent date: 2030-02-03\n\n"
        "Reasoning: high" +
            system_tail +
            "<|start|>user<|message|>hi<|end|><|start|>assistant<|channel|>final<|message|>a"
            "<|return|>");
  CHECK(*RenderChat(ChatLayout::kChatMLQwen3, chat, true, harmony) ==
        *RenderChat(ChatLayout::kChatMLQwen3, chat, true));
}

TEST_CASE("RenderChat harmony: channel tags in an assistant content are refused") {
  const absl::StatusOr<std::string> r = RenderChat(
      ChatLayout::kHarmony, {S("s"), U("q"), A("x<|channel|>final<|message|>y"), U("q2")}, true);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(r.status().message() ==
        "messages[2].content: holds '<|channel|>final<|message|>': an assistant content is the "
        "final channel's text alone, without harmony's channel tags (gpt-oss's chat template "
        "refuses it too)");
  // Elsewhere (system, user, other channel names) the tags are text.
  CHECK(RenderChat(ChatLayout::kHarmony,
                   {S("<|channel|>final<|message|>"), U("<|channel|>analysis<|message|>"),
                    A("<|channel|>commentary<|message|>")},
                   false)
            .ok());
}

}  // namespace
}  // namespace moebatch
