// nlohmann/json behind autoshard's messages: its parse errors are re-worded to name the line,
// column and the usual causes, and the accessors name the value that has the wrong kind.
#include "io/json.h"

#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

namespace autoshard {

namespace {

constexpr int kMaxDepth = 512;
constexpr std::string_view kBom = "\xEF\xBB\xBF";

// Messages must stay valid UTF-8 (they reach Python as str), so other bytes are named in hex.
std::string describe_byte(unsigned char u) {
  if (u >= 0x20 && u < 0x7F) return fmt::format("character '{}'", static_cast<char>(u));
  return fmt::format("byte 0x{:02X}", u);
}

// Length of the valid UTF-8 sequence starting at `p` (lead byte >= 0x80), 0 when invalid:
// overlong forms, surrogates and code points above U+10FFFF are invalid too.
size_t utf8_sequence(std::string_view s, size_t p) {
  const auto b = [&](size_t k) { return p + k < s.size() ? static_cast<unsigned char>(s[p + k]) : 0u; };
  const unsigned c0 = b(0);
  size_t len = c0 >= 0xF0 && c0 <= 0xF4 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC2 && c0 <= 0xDF ? 2 : 0;
  if (c0 >= 0xF5) len = 0;
  for (size_t k = 1; k < len; ++k)
    if ((b(k) & 0xC0) != 0x80) return 0;
  if (len == 3 && ((c0 == 0xE0 && b(1) < 0xA0) || (c0 == 0xED && b(1) >= 0xA0))) return 0;
  if (len == 4 && ((c0 == 0xF0 && b(1) < 0x90) || (c0 == 0xF4 && b(1) >= 0x90))) return 0;
  return len;
}

// The first byte at or before `limit` that does not start a valid UTF-8 sequence: the parser
// stops on the byte after a bad lead byte, but the user must be shown the bad one.
size_t first_invalid_utf8(std::string_view s, size_t limit) {
  for (size_t i = 0; i < s.size() && i <= limit;) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t len = utf8_sequence(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

[[noreturn]] void fail_at(std::string_view s, size_t p, const std::string& msg) {
  size_t line = 1, col = 1;  // columns count characters, not the bytes of UTF-8 sequences
  for (size_t i = 0; i < p && i < s.size(); ++i) {
    if (s[i] == '\n') {
      ++line;
      col = 1;
    } else if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
      ++col;
    }
  }
  if (s.substr(0, 3) == kBom && line == 1 && col > 1) --col;
  throw JsonError(fmt::format("invalid JSON at line {}, column {}: {}", line, col, msg));
}

// The object key whose value starts at `p` ("key": <p>), for the NaN message; empty if none.
std::string key_before(std::string_view s, size_t p) {
  size_t i = p;
  auto skip_ws_back = [&] {
    while (i > 0 && (s[i - 1] == ' ' || s[i - 1] == '\n' || s[i - 1] == '\t' || s[i - 1] == '\r')) --i;
  };
  skip_ws_back();
  if (i == 0 || s[i - 1] != ':') return {};
  --i;
  skip_ws_back();
  if (i == 0 || s[i - 1] != '"') return {};
  const size_t end = --i;
  while (i > 0 && !(s[i - 1] == '"' && (i < 2 || s[i - 2] != '\\'))) --i;
  if (i == 0) return {};
  return std::string(s.substr(i, end - i));
}

// nlohmann's reason without its "[json.exception...] parse error at line L, column C: "
// prefix, with bytes outside printable ASCII named in hex (its "last read" echoes input).
std::string library_reason(const char* what) {
  std::string_view w(what);
  if (size_t c = w.find(", column "); c != std::string_view::npos)
    if (size_t colon = w.find(": ", c); colon != std::string_view::npos) w.remove_prefix(colon + 2);
  std::string out;
  for (char ch : w) {
    const auto u = static_cast<unsigned char>(ch);
    out += (u >= 0x20 && u < 0x7F) ? std::string(1, ch) : "<" + describe_byte(u) + ">";
  }
  return out;
}

[[noreturn]] void explain_parse_error(std::string_view s, const Json::parse_error& e) {
  const size_t body = s.substr(0, 3) == kBom ? 3 : 0;
  if (s.find_first_not_of(" \t\r\n", body) == std::string_view::npos)
    fail_at(s, s.size(), "the input is empty (no JSON value)");
  size_t p = e.byte > 0 ? e.byte - 1 : 0;
  if (p > s.size()) p = s.size();
  const std::string reason = library_reason(e.what());
  // NaN / Infinity: the lexer stops on their first letter (after the '-' of -Infinity).
  if (p < s.size() && (s.substr(p, 3) == "NaN" || s.substr(p, 8) == "Infinity")) {
    const size_t start = (p > 0 && s[p - 1] == '-') ? p - 1 : p;
    const std::string key = key_before(s, start);
    fail_at(s, start,
            (key.empty() ? std::string() : "the value of \"" + key + "\": ") +
                "NaN and Infinity are not JSON numbers (Python's json.dumps writes them for float('nan') and "
                "float('inf')); give a finite number");
  }
  if (reason.find("ill-formed UTF-8") != std::string::npos || reason.find("invalid BOM") != std::string::npos) {
    const size_t bad = first_invalid_utf8(s, p);
    if (bad != std::string_view::npos) {
      const auto u = static_cast<unsigned char>(s[bad]);
      if (reason.find("invalid BOM") != std::string::npos)
        fail_at(s, bad,
                "unexpected " + describe_byte(u) + " (JSON text must be UTF-8; an incomplete byte-order mark?)");
      fail_at(s, bad, describe_byte(u) + " in a string is not valid UTF-8; save the file as UTF-8");
    }
  }
  if (p < s.size() && static_cast<unsigned char>(s[p]) >= 0x80)
    fail_at(
        s, p,
        "unexpected input, found " + describe_byte(static_cast<unsigned char>(s[p])) + " (JSON text must be UTF-8)");
  if (p >= s.size())
    fail_at(s, p,
            reason + (reason.find("end of input") != std::string::npos
                          ? " (is the file cut short?)"
                          : ", found the end of the input (is the file cut short?)"));
  fail_at(s, p, reason);
}

// Where the nesting first passes kMaxDepth, or npos. Readers recurse over nested values, so
// a deep document must be refused before they see it.
size_t too_deep_at(std::string_view s) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

std::string kind_error(std::string_view where, const char* want, const Json& got) {
  return fmt::format("{}: expected {}, found {}", where, want, json_kind_name(got));
}

}  // namespace

Json parse_json(std::string_view text) {
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end());
  } catch (const Json::parse_error& e) {
    explain_parse_error(text, e);
  }
  if (size_t deep = too_deep_at(text); deep != std::string_view::npos)
    fail_at(text, deep, fmt::format("nesting deeper than {} levels", kMaxDepth));
  // nlohmann's lexer ends the text at a NUL byte and would drop whatever follows it.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail_at(text, nul, "a NUL byte after the JSON value: the file is damaged or not a JSON text file");
  return doc;
}

std::string dump_json(const Json& j, int indent) {
  // Strings come from validated input or from autoshard itself; `replace` keeps a stray
  // invalid byte from turning a whole plan into an exception.
  return j.dump(indent, ' ', false, Json::error_handler_t::replace);
}

Json json_number(double d) {
  if (!std::isfinite(d)) return d > 0 ? Json(1e308) : d < 0 ? Json(-1e308) : Json(nullptr);
  if (std::nearbyint(d) == d && std::fabs(d) < 9007199254740992.0) return Json(static_cast<int64_t>(d));
  return Json(d);
}

const char* json_kind_name(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "bool";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "number";
    case Json::value_t::string:
      return "string";
    case Json::value_t::array:
      return "array";
    case Json::value_t::object:
      return "object";
    default:
      return "?";
  }
}

bool json_bool(const Json& j, std::string_view where) {
  if (!j.is_boolean()) throw JsonError(kind_error(where, "a bool", j));
  return j.get<bool>();
}

double json_double(const Json& j, std::string_view where) {
  if (!j.is_number()) throw JsonError(kind_error(where, "a number", j));
  return j.get<double>();
}

bool json_is_int64(const Json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  return j.is_number_integer();
}

std::optional<int64_t> json_integral_double(double d) {
  if (std::nearbyint(d) == d && std::fabs(d) < 9.2e18) return static_cast<int64_t>(d);
  return std::nullopt;
}

int64_t json_int(const Json& j, std::string_view where) {
  if (!j.is_number()) throw JsonError(kind_error(where, "an integer", j));
  if (json_is_int64(j)) return j.get<int64_t>();
  const double d = j.get<double>();
  if (const auto i = json_integral_double(d)) return *i;
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  throw JsonError(fmt::format("{}: expected an integer, found {}{}", where, std::string_view(buf, r.ptr - buf),
                              std::fabs(d) >= 9.2e18 ? " (does not fit in 64 bits)" : ""));
}

const std::string& json_string(const Json& j, std::string_view where) {
  if (!j.is_string()) throw JsonError(kind_error(where, "a string", j));
  return j.get_ref<const std::string&>();
}

const Json::array_t& json_array(const Json& j, std::string_view where) {
  if (!j.is_array()) throw JsonError(kind_error(where, "an array", j));
  return j.get_ref<const Json::array_t&>();
}

const Json::object_t& json_items(const Json& j, std::string_view where) {
  if (!j.is_object()) throw JsonError(kind_error(where, "an object", j));
  return j.get_ref<const Json::object_t&>();
}

const Json* json_find(const Json& j, std::string_view key) {
  if (!j.is_object()) return nullptr;
  for (const auto& kv : j.get_ref<const Json::object_t&>())
    if (kv.first == key) return &kv.second;
  return nullptr;
}

const Json& json_at(const Json& j, std::string_view key, std::string_view where) {
  if (!j.is_object()) throw JsonError(kind_error(where, "an object", j));
  const Json* v = json_find(j, key);
  if (!v) throw JsonError(fmt::format("{}: missing key \"{}\"", where, key));
  return *v;
}

}  // namespace autoshard
