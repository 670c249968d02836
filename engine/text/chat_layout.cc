#include "engine/text/chat_layout.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <ctime>
#include <initializer_list>

#include "absl/strings/str_cat.h"

namespace moebatch {
namespace {

struct LayoutInfo {
  ChatLayout layout;
  const char* name;
};

constexpr std::array<LayoutInfo, 9> kLayouts = {{
    {ChatLayout::kChatML, "chatml"},
    {ChatLayout::kChatMLQwen15, "qwen1.5"},
    {ChatLayout::kChatMLQwen25, "qwen2.5"},
    {ChatLayout::kChatMLQwen3, "qwen3"},
    {ChatLayout::kChatMLSmolLM2, "smollm2"},
    {ChatLayout::kLlama3, "llama3"},
    {ChatLayout::kLlama31, "llama3.1"},
    {ChatLayout::kLlama32, "llama3.2"},
    {ChatLayout::kHarmony, "harmony"},
}};

// --- CanonicalChatTemplate ---------------------------------------------------------------------

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

bool IsIdentifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), IsWordChar);
}

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// A literal's value written as '...' with the escapes the canonical form uses.
void AppendLiteral(std::string_view value, std::string* out) {
  out->push_back('\'');
  for (char c : value) {
    switch (c) {
      case '\\':
        out->append("\\\\");
        break;
      case '\'':
        out->append("\\'");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        out->push_back(c);
    }
  }
  out->push_back('\'');
}

// Canonicalises the code of one {{ }} or {% %} tag (without its delimiters and marks).
void AppendCode(std::string_view code, std::string* out) {
  size_t i = 0;
  bool pending_space = false;
  while (i < code.size()) {
    const char c = code[i];
    if (IsSpace(c)) {
      pending_space = true;
      ++i;
      continue;
    }
    if (c == '\'' || c == '"') {
      // A string literal, its escapes decoded as Jinja (Python) does for the common ones.
      std::string value;
      size_t j = i + 1;
      for (; j < code.size() && code[j] != c; ++j) {
        if (code[j] == '\\' && j + 1 < code.size()) {
          const char e = code[++j];
          switch (e) {
            case 'n':
              value.push_back('\n');
              break;
            case 't':
              value.push_back('\t');
              break;
            case 'r':
              value.push_back('\r');
              break;
            case '\\':
            case '\'':
            case '"':
              value.push_back(e);
              break;
            default:
              value.push_back('\\');
              value.push_back(e);
          }
        } else {
          value.push_back(code[j]);
        }
      }
      i = std::min(j + 1, code.size());
      // x['name'] -> x.name
      size_t next = i;
      while (next < code.size() && IsSpace(code[next])) ++next;
      if (!out->empty() && out->back() == '[' && next < code.size() && code[next] == ']' &&
          IsIdentifier(value)) {
        out->back() = '.';
        out->append(value);
        i = next + 1;
      } else {
        AppendLiteral(value, out);
      }
      pending_space = false;
      continue;
    }
    if (pending_space && !out->empty() && IsWordChar(out->back()) && IsWordChar(c)) {
      out->push_back(' ');
    }
    pending_space = false;
    out->push_back(c);
    ++i;
  }
}

// The position of the next tag ("{{", "{%" or "{#") at or after `from`, or npos.
size_t FindTag(std::string_view text, size_t from) {
  for (size_t p = text.find('{', from); p != text.npos && p + 1 < text.size();
       p = text.find('{', p + 1)) {
    const char k = text[p + 1];
    if (k == '{' || k == '%' || k == '#') return p;
  }
  return text.npos;
}

// The position of the delimiter `close` ending the tag whose content starts at `from`: the first
// outside string literals (comments have none); text.size() if the tag is not closed.
size_t FindTagEnd(std::string_view text, size_t from, std::string_view close, bool comment) {
  char quote = 0;
  for (size_t j = from; j + 1 < text.size(); ++j) {
    const char c = text[j];
    if (!comment && quote != 0) {
      if (c == '\\') {
        ++j;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (!comment && (c == '\'' || c == '"')) {
      quote = c;
    } else if (text.compare(j, close.size(), close) == 0) {
      return j;
    }
  }
  return text.size();
}

// --- signatures ---------------------------------------------------------------------------------

// What RecogniseChatTemplate looks for in the canonical text of a layout's template (written in
// canonical form): `prefix` at its start, `suffix` at its end, every fragment somewhere; `exact`:
// the canonical text is the fragments concatenated (the short templates, where anything added
// would change the text).
struct Signature {
  ChatLayout layout;
  bool exact;
  std::string prefix;
  std::vector<std::string> fragments;
  std::string suffix;
};

std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p.data(), p.size());
  return out;
}

// The ChatML turn and generation prompt, as the short templates write them.
constexpr std::string_view kChatMLTurn =
    R"({{'<|im_start|>'+message.role+'\n'+message.content+'<|im_end|>'+'\n'}})";
constexpr std::string_view kChatMLEnd =
    R"({%endfor%}{%if add_generation_prompt%}{{'<|im_start|>assistant\n'}}{%endif%})";
constexpr std::string_view kChatMLDefaultSystemIf =
    "{%for message in messages%}{%if loop.first and messages[0].role!='system'%}";
// Llama 3.1 and 3.2 (their templates differ in tools and the date's default only).
constexpr std::string_view kLlama31System =
    R"({%if messages[0].role=='system'%}{%set system_message=messages[0].content|trim%})"
    R"({%set messages=messages[1:]%}{%else%}{%set system_message=''%}{%endif%})"
    R"({{'<|start_header_id|>system<|end_header_id|>\n\n'}})";
constexpr std::string_view kLlama31Dates =
    R"({{'Cutting Knowledge Date: December 2023\n'}}{{'Today Date: '+date_string+'\n\n'}})";
constexpr std::string_view kLlama31SystemEnd = R"({{system_message}}{{'<|eot_id|>'}})";
constexpr std::string_view kLlama31Turn =
    R"({%for message in messages%}{%if not(message.role=='ipython'or message.role=='tool'or)"
    R"('tool_calls'in message)%}{{'<|start_header_id|>'+message.role+'<|end_header_id|>\n\n')"
    R"(+message.content|trim+'<|eot_id|>'}})";
constexpr std::string_view kLlama31End =
    R"({%endfor%}{%if add_generation_prompt%})"
    R"({{'<|start_header_id|>assistant<|end_header_id|>\n\n'}}{%endif%})";

const std::vector<Signature>& Signatures() {
  static const std::vector<Signature>* const signatures = new std::vector<Signature>{
      {ChatLayout::kChatML,
       true,
       "",
       {Cat({"{%for message in messages%}", kChatMLTurn}), std::string(kChatMLEnd)},
       ""},
      {ChatLayout::kChatMLQwen15,
       true,
       "",
       {std::string(kChatMLDefaultSystemIf),
        R"({{'<|im_start|>system\nYou are a helpful assistant<|im_end|>\n'}})",
        Cat({"{%endif%}", kChatMLTurn}), std::string(kChatMLEnd)},
       ""},
      {ChatLayout::kChatMLSmolLM2,
       true,
       "",
       {std::string(kChatMLDefaultSystemIf),
        R"({{'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by )"
        R"(Hugging Face<|im_end|>\n'}})",
        Cat({"{%endif%}", kChatMLTurn}), std::string(kChatMLEnd)},
       ""},
      {ChatLayout::kChatMLQwen25,
       false,
       "",
       {R"({%if messages[0].role=='system'%}{{'<|im_start|>system\n'+messages[0].content+)"
        R"('<|im_end|>\n'}}{%else%}{{'<|im_start|>system\nYou are Qwen, created by Alibaba )"
        R"(Cloud. You are a helpful assistant.<|im_end|>\n'}}{%endif%})",
        Cat({R"({%for message in messages%}{%if(message.role=='user')or(message.role=='system')"
             R"(and not loop.first)or(message.role=='assistant'and not message.tool_calls)%})",
             kChatMLTurn})},
       std::string(kChatMLEnd)},
      {ChatLayout::kChatMLQwen3,
       false,
       "",
       {R"({%else%}{%if messages[0].role=='system'%}{{'<|im_start|>system\n'+)"
        R"(messages[0].content+'<|im_end|>\n'}}{%endif%}{%endif%})",
        R"({%set ns=namespace(multi_step_tool=true,last_query_index=messages|length-1)%})"
        R"({%for message in messages[::-1]%}{%set index=(messages|length-1)-loop.index0%})"
        R"({%if ns.multi_step_tool and message.role=='user'and not(message.content.startswith()"
        R"('<tool_response>')and message.content.endswith('</tool_response>'))%})"
        R"({%set ns.multi_step_tool=false%}{%set ns.last_query_index=index%}{%endif%})"
        R"({%endfor%})",
        R"({%for message in messages%}{%if(message.role=='user')or(message.role=='system'and )"
        R"(not loop.first)%}{{'<|im_start|>'+message.role+'\n'+message.content+'<|im_end|>'+)"
        R"('\n'}}{%elif message.role=='assistant'%}{%set content=message.content%})"
        R"({%set reasoning_content=''%})",
        R"({%if'</think>'in message.content%}{%set content=message.content.split('</think>'))"
        R"([-1].lstrip('\n')%}{%set reasoning_content=message.content.split('</think>')[0].)"
        R"(rstrip('\n').split('<think>')[-1].lstrip('\n')%}{%endif%})",
        R"({%if loop.index0>ns.last_query_index%}{%if loop.last or(not loop.last and )"
        R"(reasoning_content)%}{{'<|im_start|>'+message.role+'\n<think>\n'+reasoning_content.)"
        R"(strip('\n')+'\n</think>\n\n'+content.lstrip('\n')}}{%else%}{{'<|im_start|>'+)"
        R"(message.role+'\n'+content}}{%endif%}{%else%}{{'<|im_start|>'+message.role+'\n'+)"
        R"(content}}{%endif%})",
        R"({{'<|im_end|>\n'}}{%elif message.role=='tool'%})"},
       R"({%endfor%}{%if add_generation_prompt%}{{'<|im_start|>assistant\n'}})"
       R"({%if enable_thinking is defined and enable_thinking is false%})"
       R"({{'<think>\n\n</think>\n\n'}}{%endif%}{%endif%})"},
      {ChatLayout::kLlama3,
       true,
       "",
       {R"({%set loop_messages=messages%}{%for message in loop_messages%}{%set content=)"
        R"('<|start_header_id|>'+message.role+'<|end_header_id|>\n\n'+message.content|trim+)"
        R"('<|eot_id|>'%})",
        "{%if loop.index0==0%}{%set content=bos_token+content%}{%endif%}{{content}}",
        R"({%endfor%}{%if add_generation_prompt%})"
        R"({{'<|start_header_id|>assistant<|end_header_id|>\n\n'}}{%endif%})"},
       ""},
      {ChatLayout::kLlama31,
       false,
       "{{bos_token}}",
       {"{%if not date_string is defined%}{%set date_string='26 Jul 2024'%}{%endif%}",
        std::string(kLlama31System), std::string(kLlama31Dates), std::string(kLlama31SystemEnd),
        std::string(kLlama31Turn)},
       std::string(kLlama31End)},
      {ChatLayout::kLlama32,
       false,
       "{{bos_token}}",
       {"{%if not date_string is defined%}{%if strftime_now is defined%}"
        "{%set date_string=strftime_now('%d %b %Y')%}{%else%}"
        "{%set date_string='26 Jul 2024'%}{%endif%}{%endif%}",
        std::string(kLlama31System), std::string(kLlama31Dates), std::string(kLlama31SystemEnd),
        std::string(kLlama31Turn)},
       std::string(kLlama31End)},
      // gpt-oss: every part but the tool branches (tool definitions, builtin tools, tool calls,
      // tool messages), which a plain conversation never enters.
      {ChatLayout::kHarmony,
       false,
       "",
       {R"({%macro build_system_message()%}{%if model_identity is not defined%})"
        R"({%set model_identity='You are ChatGPT, a large language model trained by OpenAI.'%})"
        R"({%endif%}{{model_identity+'\n'}}{{'Knowledge cutoff: 2024-06\n'}})"
        R"({{'Current date: '+strftime_now('%Y-%m-%d')+'\n\n'}})"
        R"({%if reasoning_effort is not defined%}{%set reasoning_effort='medium'%}{%endif%})"
        R"({{'Reasoning: '+reasoning_effort+'\n\n'}}{%if builtin_tools%})",
        R"({%endif%}{{'# Valid channels: analysis, commentary, final. Channel must be included )"
        R"(for every message.'}}{%if tools%})",
        R"({%endmacro%}{{'<|start|>system<|message|>'}}{{build_system_message()}}{{'<|end|>'}})"
        R"({%if messages[0].role=='developer'or messages[0].role=='system'%})"
        R"({%set developer_message=messages[0].content%}{%set loop_messages=messages[1:]%})"
        R"({%else%}{%set developer_message=''%}{%set loop_messages=messages%}{%endif%})"
        R"({%if developer_message or tools%}{{'<|start|>developer<|message|>'}})"
        R"({%if developer_message%}{{'# Instructions\n\n'}}{{developer_message}}{{'\n\n'}})"
        R"({%endif%}{%if tools%})",
        R"({{'<|end|>'}}{%endif%}{%set last_tool_call=namespace(name=none)%})"
        R"({%for message in loop_messages%}{%if message.role=='assistant'%})"
        R"({%if'content'in message%}{%if'<|channel|>analysis<|message|>'in message.content or)"
        R"('<|channel|>final<|message|>'in message.content%}{{raise_exception(')",
        R"({%elif loop.last and not add_generation_prompt%}{%if'thinking'in message%})"
        R"({{'<|start|>assistant<|channel|>analysis<|message|>'+message.thinking+'<|end|>'}})"
        R"({%endif%}{{'<|start|>assistant<|channel|>final<|message|>'+message.content+)"
        R"('<|return|>'}}{%else%}{{'<|start|>assistant<|channel|>final<|message|>'+)"
        R"(message.content+'<|end|>'}})",
        R"({%elif message.role=='user'%}{{'<|start|>user<|message|>'+message.content+'<|end|>'}})"
        R"({%endif%}{%endfor%})"},
       R"({%if add_generation_prompt%}{{'\n<|start|>assistant\n'}}{%endif%})"},
  };
  return *signatures;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool EndsWith(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

// How much of a signature a canonical text has: the bytes of its parts present that hold a
// string literal (how close the text is to the signature's template), the first part missing
// (empty if none), and whether it matches.
struct SignatureMatch {
  size_t score = 0;
  std::string_view first_missing;
  bool matches = false;
};

SignatureMatch Match(const Signature& sig, std::string_view c) {
  SignatureMatch m;
  bool all = true;
  auto part = [&](bool present, std::string_view text) {
    if (present) {
      if (text.find('\'') != text.npos) m.score += text.size();
    } else {
      all = false;
      if (m.first_missing.empty()) m.first_missing = text;
    }
  };
  if (!sig.prefix.empty()) part(StartsWith(c, sig.prefix), sig.prefix);
  for (const std::string& f : sig.fragments) part(c.find(f) != c.npos, f);
  if (!sig.suffix.empty()) part(EndsWith(c, sig.suffix), sig.suffix);
  m.matches = all;
  if (m.matches && sig.exact) {
    std::string whole;
    for (const std::string& f : sig.fragments) whole.append(f);
    m.matches = whole == c;
  }
  return m;
}

// --- rendering -----------------------------------------------------------------------------------

// The code point at s[i] (valid UTF-8 assumed) and its length in bytes.
char32_t DecodeAt(std::string_view s, size_t i, size_t* len) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *len = 1;
    return c;
  }
  *len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  char32_t cp = c & (*len == 4 ? 0x07 : *len == 3 ? 0x0F : 0x1F);
  for (size_t k = 1; k < *len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80                 ? 1
                       : c >= 0xC2 && c <= 0xDF ? 2
                       : c >= 0xE0 && c <= 0xEF ? 3
                       : c >= 0xF0 && c <= 0xF4 ? 4
                                                : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    size_t n;
    const char32_t cp = DecodeAt(s, i, &n);
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return false;
    }
    i += len;
  }
  return true;
}

// Python's str.isspace() (what Jinja's `trim` strips): the code points whose bidirectional type
// is WS, B or S, or whose category is Zs.
bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Jinja's `trim` filter: Python's str.strip().
std::string_view Trim(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t len;
    if (!IsPythonSpace(DecodeAt(s, begin, &len))) break;
    begin += len;
  }
  size_t end = s.size();
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t len;
    if (!IsPythonSpace(DecodeAt(s, start, &len))) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// Python's str.lstrip('\n'), rstrip('\n') and strip('\n').
std::string_view LstripNewlines(std::string_view s) {
  const size_t i = s.find_first_not_of('\n');
  return i == s.npos ? std::string_view() : s.substr(i);
}
std::string_view RstripNewlines(std::string_view s) {
  const size_t i = s.find_last_not_of('\n');
  return i == s.npos ? std::string_view() : s.substr(0, i + 1);
}
std::string_view StripNewlines(std::string_view s) { return LstripNewlines(RstripNewlines(s)); }

void Append(std::string* out, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts) out->append(p.data(), p.size());
}

// strftime_now("%d %b %Y") as transformers calls it: the local date, English month abbreviation
// (Python's C locale), e.g. "05 Mar 2026".
std::string TodayDateString() {
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  const char day[3] = {static_cast<char>('0' + local.tm_mday / 10),
                       static_cast<char>('0' + local.tm_mday % 10), '\0'};
  return absl::StrCat(day, " ", kMonths[local.tm_mon], " ", local.tm_year + 1900);
}

absl::Status ValidateMessages(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) {
    return absl::InvalidArgumentError("messages[0]: missing (an empty conversation)");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].role: '", m.role,
                                                     "' is not one of system, user, assistant"));
    }
    if (!IsValidUtf8(m.content)) {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].content: not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

// chatml, qwen1.5, smollm2: every message a turn; `default_system` (if any) first when
// messages[0] is not a system message.
std::string RenderChatML(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                         std::string_view default_system) {
  std::string out;
  if (!default_system.empty() && messages[0].role != "system") {
    Append(&out, {"<|im_start|>system\n", default_system, "<|im_end|>\n"});
  }
  for (const ChatMessage& m : messages) {
    Append(&out, {"<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"});
  }
  if (add_generation_prompt) out.append("<|im_start|>assistant\n");
  return out;
}

// qwen2.5: the system turn (messages[0]'s or the default), then every other message a turn.
std::string RenderQwen25(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  const bool system_first = messages[0].role == "system";
  std::string out = "<|im_start|>system\n";
  out.append(system_first ? messages[0].content
                          : "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  out.append("<|im_end|>\n");
  for (size_t i = system_first ? 1 : 0; i < messages.size(); ++i) {
    Append(&out, {"<|im_start|>", messages[i].role, "\n", messages[i].content, "<|im_end|>\n"});
  }
  if (add_generation_prompt) out.append("<|im_start|>assistant\n");
  return out;
}

// qwen3 (the header comment describes the thinking rules).
std::string RenderQwen3(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                        bool enable_thinking) {
  const size_t n = messages.size();
  // The last user query: the last user message that is not "<tool_response>...</tool_response>"
  // (the template's ns.last_query_index; n - 1 when there is none).
  size_t last_query = n - 1;
  for (size_t i = n; i-- > 0;) {
    const std::string_view c = messages[i].content;
    if (messages[i].role == "user" &&
        !(StartsWith(c, "<tool_response>") && EndsWith(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  std::string out;
  if (messages[0].role == "system") {
    Append(&out, {"<|im_start|>system\n", messages[0].content, "<|im_end|>\n"});
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role != "assistant") {
      if (i > 0 || m.role != "system") {
        Append(&out, {"<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n"});
      }
      continue;
    }
    std::string_view content = m.content;
    std::string_view reasoning;
    const size_t first_close = content.find("</think>");
    if (first_close != content.npos) {
      std::string_view before = RstripNewlines(content.substr(0, first_close));
      const size_t open = before.rfind("<think>");
      if (open != before.npos) before.remove_prefix(open + std::string_view("<think>").size());
      reasoning = LstripNewlines(before);
      content = LstripNewlines(
          content.substr(content.rfind("</think>") + std::string_view("</think>").size()));
    }
    if (i > last_query && (i == n - 1 || !reasoning.empty())) {
      Append(&out, {"<|im_start|>assistant\n<think>\n", StripNewlines(reasoning), "\n</think>\n\n",
                    LstripNewlines(content)});
    } else {
      Append(&out, {"<|im_start|>assistant\n", content});
    }
    out.append("<|im_end|>\n");
  }
  if (add_generation_prompt) {
    out.append("<|im_start|>assistant\n");
    if (!enable_thinking) out.append("<think>\n\n</think>\n\n");
  }
  return out;
}

constexpr std::string_view kLlama3GenerationPrompt =
    "<|start_header_id|>assistant<|end_header_id|>\n\n";

void AppendLlama3Turn(const ChatMessage& m, std::string* out) {
  Append(out,
         {"<|start_header_id|>", m.role, "<|end_header_id|>\n\n", Trim(m.content), "<|eot_id|>"});
}

// llama3: BOS before the first message, every message a turn with trimmed content.
std::string RenderLlama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) AppendLlama3Turn(m, &out);
  if (add_generation_prompt) out.append(kLlama3GenerationPrompt);
  return out;
}

// llama3.1, llama3.2: BOS, the system turn with the dates and messages[0] if it is a system
// message, then every other message a turn.
std::string RenderLlama31(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          std::string_view date_string) {
  const bool system_first = messages[0].role == "system";
  std::string out = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n";
  Append(&out, {"Cutting Knowledge Date: December 2023\nToday Date: ", date_string, "\n\n",
                system_first ? Trim(messages[0].content) : std::string_view(), "<|eot_id|>"});
  for (size_t i = system_first ? 1 : 0; i < messages.size(); ++i) {
    AppendLlama3Turn(messages[i], &out);
  }
  if (add_generation_prompt) out.append(kLlama3GenerationPrompt);
  return out;
}

// strftime_now("%Y-%m-%d") as transformers calls it: the local date, e.g. "2026-03-05".
std::string TodayIsoDate() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &local);
  return buf;
}

// harmony (the header comment describes the layout).
absl::StatusOr<std::string> RenderHarmony(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt,
                                          const ChatTemplateOptions& options) {
  std::string out = "<|start|>system<|message|>";
  Append(&out,
         {options.model_identity ? std::string_view(*options.model_identity)
                                 : "You are ChatGPT, a large language model trained by OpenAI.",
          "\nKnowledge cutoff: 2024-06\nCurrent date: ",
          options.date_string ? *options.date_string : TodayIsoDate(), "\n\nReasoning: ",
          options.reasoning_effort ? std::string_view(*options.reasoning_effort) : "medium",
          "\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
          "every message.<|end|>"});
  const bool system_first = messages[0].role == "system";
  if (system_first && !messages[0].content.empty()) {
    Append(&out,
           {"<|start|>developer<|message|># Instructions\n\n", messages[0].content, "\n\n<|end|>"});
  }
  for (size_t i = system_first ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      Append(&out, {"<|start|>user<|message|>", m.content, "<|end|>"});
    } else if (m.role == "assistant") {
      for (std::string_view tag :
           {"<|channel|>analysis<|message|>", "<|channel|>final<|message|>"}) {
        if (m.content.find(tag) != std::string::npos) {
          return absl::InvalidArgumentError(absl::StrCat(
              "messages[", i, "].content: holds '", std::string(tag),
              "': an assistant content is the final channel's text alone, without harmony's "
              "channel tags (gpt-oss's chat template refuses it too)"));
        }
      }
      const bool returns = i + 1 == messages.size() && !add_generation_prompt;
      Append(&out, {"<|start|>assistant<|channel|>final<|message|>", m.content,
                    returns ? "<|return|>" : "<|end|>"});
    }
    // A later system message: the template writes nothing for it.
  }
  if (add_generation_prompt) out.append("<|start|>assistant");
  return out;
}

}  // namespace

absl::StatusOr<ChatLayout> RecogniseChatTemplate(std::string_view template_text) {
  const std::string canonical = CanonicalChatTemplate(template_text);
  const Signature* closest = nullptr;
  SignatureMatch closest_match;
  for (const Signature& sig : Signatures()) {
    const SignatureMatch m = Match(sig, canonical);
    if (m.matches) return sig.layout;
    // The signature with the most of its template present (the first of equals).
    if (m.score > 0 && (closest == nullptr || m.score > closest_match.score)) {
      closest = &sig;
      closest_match = m;
    }
  }
  std::string why;
  if (canonical.empty()) {
    why = "the template is empty";
  } else if (closest == nullptr) {
    why = "it shares no part with the templates moebatch lays out";
  } else if (closest_match.first_missing.empty()) {
    why = absl::StrCat("closest: ", ChatLayoutName(closest->layout), ", whose template it extends");
  } else {
    std::string missing(closest_match.first_missing);
    if (missing.size() > 100) missing = missing.substr(0, 100) + "...";
    why = absl::StrCat("closest: ", ChatLayoutName(closest->layout), ", but it lacks ", missing);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("chat_template: not a template moebatch recognises (", why,
                   "); give --chat_template NAME with one of: ", ChatLayoutNameList()));
}

absl::StatusOr<std::string> RenderChat(ChatLayout layout, const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt,
                                       const ChatTemplateOptions& options) {
  if (absl::Status s = ValidateMessages(messages); !s.ok()) return s;
  switch (layout) {
    case ChatLayout::kChatML:
      return RenderChatML(messages, add_generation_prompt, "");
    case ChatLayout::kChatMLQwen15:
      return RenderChatML(messages, add_generation_prompt, "You are a helpful assistant");
    case ChatLayout::kChatMLSmolLM2:
      return RenderChatML(messages, add_generation_prompt,
                          "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    case ChatLayout::kChatMLQwen25:
      return RenderQwen25(messages, add_generation_prompt);
    case ChatLayout::kChatMLQwen3:
      return RenderQwen3(messages, add_generation_prompt, options.enable_thinking);
    case ChatLayout::kLlama3:
      return RenderLlama3(messages, add_generation_prompt);
    case ChatLayout::kLlama31:
      return RenderLlama31(messages, add_generation_prompt,
                           options.date_string.value_or("26 Jul 2024"));
    case ChatLayout::kLlama32:
      return RenderLlama31(messages, add_generation_prompt,
                           options.date_string ? *options.date_string : TodayDateString());
    case ChatLayout::kHarmony:
      return RenderHarmony(messages, add_generation_prompt, options);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("layout: ", static_cast<int>(layout), " is not a ChatLayout"));
}

std::string CanonicalChatTemplate(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const size_t tag = FindTag(text, i);
    const std::string_view raw = text.substr(i, tag == text.npos ? text.npos : tag - i);
    if (!std::all_of(raw.begin(), raw.end(), IsSpace)) {
      out.append("{{");
      AppendLiteral(raw, &out);
      out.append("}}");
    }
    if (tag == text.npos) break;
    const char kind = text[tag + 1];
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const size_t end = FindTagEnd(text, tag + 2, close, kind == '#');
    if (kind != '#') {
      std::string_view code = text.substr(tag + 2, end - (tag + 2));
      if (!code.empty() && (code.front() == '-' || code.front() == '+')) code.remove_prefix(1);
      if (!code.empty() && (code.back() == '-' || code.back() == '+')) code.remove_suffix(1);
      out.append(text.substr(tag, 2));
      AppendCode(code, &out);
      out.append(close);
    }
    i = std::min(end + close.size(), text.size());
  }
  return out;
}

const char* ChatLayoutName(ChatLayout layout) {
  for (const LayoutInfo& info : kLayouts) {
    if (info.layout == layout) return info.name;
  }
  return "unknown";
}

std::optional<ChatLayout> ChatLayoutFromName(std::string_view name) {
  for (const LayoutInfo& info : kLayouts) {
    if (name == info.name) return info.layout;
  }
  return std::nullopt;
}

std::string ChatLayoutNameList() {
  std::string names;
  for (const LayoutInfo& info : kLayouts) {
    if (!names.empty()) names.append(", ");
    names.append(info.name);
  }
  return names;
}

}  // namespace moebatch
