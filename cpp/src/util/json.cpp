// JSON parser and writer. Hand-written (no third-party dependency) and fast enough for the
// 100 MB IOPDDL files: numbers are parsed without locale lookups, integers kept exact.
#include "autoshard/json.h"

#include <zlib.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace autoshard {

const char* json_kind_name(Json::Kind k) {
  switch (k) {
    case Json::Kind::Null: return "null";
    case Json::Kind::Bool: return "bool";
    case Json::Kind::Number: return "number";
    case Json::Kind::String: return "string";
    case Json::Kind::Array: return "array";
    case Json::Kind::Object: return "object";
  }
  return "?";
}

Json Json::boolean(bool b) { Json j; j.kind_ = Kind::Bool; j.bool_ = b; return j; }
Json Json::number(double d) { Json j; j.kind_ = Kind::Number; j.num_ = d; j.is_int_ = false; return j; }
Json Json::integer(int64_t i) {
  Json j; j.kind_ = Kind::Number; j.is_int_ = true; j.int_ = i; j.num_ = static_cast<double>(i); return j;
}
Json Json::string(std::string s) { Json j; j.kind_ = Kind::String; j.str_ = std::move(s); return j; }
Json Json::array(std::vector<Json> items) { Json j; j.kind_ = Kind::Array; j.arr_ = std::move(items); return j; }
Json Json::object() { Json j; j.kind_ = Kind::Object; return j; }

static std::string kind_error(std::string_view where, const char* want, Json::Kind got) {
  return std::string(where) + ": expected " + want + ", found " + json_kind_name(got);
}

bool Json::as_bool(std::string_view where) const {
  if (kind_ != Kind::Bool) throw JsonError(kind_error(where, "a bool", kind_));
  return bool_;
}
double Json::as_double(std::string_view where) const {
  if (kind_ != Kind::Number) throw JsonError(kind_error(where, "a number", kind_));
  return num_;
}
int64_t Json::as_int(std::string_view where) const {
  if (kind_ != Kind::Number) throw JsonError(kind_error(where, "an integer", kind_));
  if (!is_int_) {
    if (std::nearbyint(num_) == num_ && std::fabs(num_) < 9.2e18) return static_cast<int64_t>(num_);
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, num_);
    throw JsonError(std::string(where) + ": expected an integer, found " + std::string(buf, r.ptr) +
                    (std::fabs(num_) >= 9.2e18 ? " (does not fit in 64 bits)" : ""));
  }
  return int_;
}
const std::string& Json::as_string(std::string_view where) const {
  if (kind_ != Kind::String) throw JsonError(kind_error(where, "a string", kind_));
  return str_;
}
const std::vector<Json>& Json::as_array(std::string_view where) const {
  if (kind_ != Kind::Array) throw JsonError(kind_error(where, "an array", kind_));
  return arr_;
}
std::vector<Json>& Json::as_array_mut() {
  if (kind_ != Kind::Array) throw JsonError(kind_error("value", "an array", kind_));
  return arr_;
}
const std::vector<std::pair<std::string, Json>>& Json::items(std::string_view where) const {
  if (kind_ != Kind::Object) throw JsonError(kind_error(where, "an object", kind_));
  return obj_;
}
const Json* Json::find(std::string_view key) const {
  if (kind_ != Kind::Object) return nullptr;
  for (const auto& [k, v] : obj_)
    if (k == key) return &v;
  return nullptr;
}
const Json& Json::at(std::string_view key, std::string_view where) const {
  if (kind_ != Kind::Object) throw JsonError(kind_error(where, "an object", kind_));
  const Json* v = find(key);
  if (!v) throw JsonError(std::string(where) + ": missing key \"" + std::string(key) + "\"");
  return *v;
}
Json& Json::set(std::string key, Json value) {
  if (kind_ == Kind::Null) kind_ = Kind::Object;
  if (kind_ != Kind::Object) throw JsonError("set: value is not an object");
  for (auto& [k, v] : obj_)
    if (k == key) { v = std::move(value); return v; }
  obj_.emplace_back(std::move(key), std::move(value));
  return obj_.back().second;
}
void Json::push_back(Json value) {
  if (kind_ == Kind::Null) kind_ = Kind::Array;
  if (kind_ != Kind::Array) throw JsonError("push_back: value is not an array");
  arr_.push_back(std::move(value));
}
size_t Json::size() const {
  if (kind_ == Kind::Array) return arr_.size();
  if (kind_ == Kind::Object) return obj_.size();
  return 0;
}

// ----------------------------------------------------------------------------- parser
class JsonParser {
 public:
  explicit JsonParser(std::string_view t) : s_(t) {}

  Json parse_document() {
    // A UTF-8 byte-order mark (some Windows editors write one) carries no content.
    if (s_.substr(0, 3) == "\xEF\xBB\xBF") p_ = 3;
    skip_ws();
    if (p_ == s_.size()) fail("the input is empty (no JSON value)");
    Json v = parse_value(0);
    skip_ws();
    if (p_ != s_.size()) fail("unexpected characters after the JSON value");
    return v;
  }

 private:
  std::string_view s_;
  size_t p_ = 0;
  const std::string* key_ = nullptr;  // the object key whose value is being parsed, for messages

  [[noreturn]] void fail(const std::string& msg) const {
    size_t line = 1, col = 1;  // columns count characters, not the bytes of UTF-8 sequences
    for (size_t i = 0; i < p_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') { ++line; col = 1; } else if ((static_cast<unsigned char>(s_[i]) & 0xC0) != 0x80) { ++col; }
    }
    if (s_.substr(0, 3) == "\xEF\xBB\xBF" && line == 1 && col > 1) --col;
    throw JsonError("invalid JSON at line " + std::to_string(line) + ", column " +
                    std::to_string(col) + ": " + msg);
  }
  void skip_ws() {
    while (p_ < s_.size() && (s_[p_] == ' ' || s_[p_] == '\n' || s_[p_] == '\t' || s_[p_] == '\r')) ++p_;
  }
  char peek() const { return p_ < s_.size() ? s_[p_] : '\0'; }

  Json parse_value(int depth) {
    if (depth > 512) fail("nesting deeper than 512 levels");
    if (p_ >= s_.size()) fail("unexpected end of input");
    char c = s_[p_];
    switch (c) {
      case '{': return parse_object(depth);
      case '[': return parse_array(depth);
      case '"': return Json::string(parse_string());
      case 't': expect_word("true"); return Json::boolean(true);
      case 'f': expect_word("false"); return Json::boolean(false);
      case 'n': expect_word("null"); return Json::null();
      default:
        if (s_.substr(p_, 3) == "NaN" || s_.substr(p_, 8) == "Infinity" || s_.substr(p_, 9) == "-Infinity")
          fail(std::string(key_ ? "the value of \"" + *key_ + "\": " : "") +
               "NaN and Infinity are not JSON numbers (Python's json.dumps writes them for float('nan') and "
               "float('inf')); give a finite number");
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
        fail(std::string("unexpected") + found().substr(std::string(", found").size()));
    }
  }
  // Messages must stay valid UTF-8 (they reach Python as str), so other bytes are named in hex.
  static std::string describe_byte(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) return std::string("character '") + c + "'";
    char buf[40];
    std::snprintf(buf, sizeof buf, "byte 0x%02X", u);
    return buf;
  }
  // What stands at the current position, for "expected X" messages.
  std::string found() const {
    if (p_ >= s_.size()) return ", found the end of the input (is the file cut short?)";
    const auto u = static_cast<unsigned char>(s_[p_]);
    return ", found " + describe_byte(s_[p_]) + (u >= 0x80 ? " (JSON text must be UTF-8)" : "");
  }
  // Length of the valid UTF-8 sequence starting at p_ (lead byte >= 0x80), 0 when invalid:
  // overlong forms, surrogates and code points above U+10FFFF are invalid too.
  size_t utf8_sequence() const {
    const auto b = [&](size_t k) { return p_ + k < s_.size() ? static_cast<unsigned char>(s_[p_ + k]) : 0u; };
    const unsigned c0 = b(0);
    size_t len = c0 >= 0xF0 && c0 <= 0xF4 ? 4 : c0 >= 0xE0 ? 3 : c0 >= 0xC2 && c0 <= 0xDF ? 2 : 0;
    if (c0 >= 0xF5) len = 0;
    for (size_t k = 1; k < len; ++k)
      if ((b(k) & 0xC0) != 0x80) return 0;
    if (len == 3 && ((c0 == 0xE0 && b(1) < 0xA0) || (c0 == 0xED && b(1) >= 0xA0))) return 0;
    if (len == 4 && ((c0 == 0xF0 && b(1) < 0x90) || (c0 == 0xF4 && b(1) >= 0x90))) return 0;
    return len;
  }
  void expect_word(const char* w) {
    size_t n = std::strlen(w);
    if (s_.substr(p_, n) != w) fail(std::string("expected '") + w + "'");
    p_ += n;
  }
  Json parse_number() {
    size_t start = p_;
    if (peek() == '-') ++p_;
    bool is_int = true;
    while (p_ < s_.size()) {
      char c = s_[p_];
      if (c >= '0' && c <= '9') { ++p_; continue; }
      if (c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') { is_int = false; ++p_; continue; }
      break;
    }
    const char* b = s_.data() + start;
    const char* e = s_.data() + p_;
    if (is_int) {
      int64_t v = 0;
      auto r = std::from_chars(b, e, v);
      if (r.ec == std::errc() && r.ptr == e) return Json::integer(v);
      if (r.ec != std::errc::result_out_of_range) { p_ = start; fail("malformed number"); }
      // Too large for 64 bits: keep it as a double; readers that need an integer complain.
    }
    double d = 0;
    auto r = std::from_chars(b, e, d);
    if (r.ec == std::errc::result_out_of_range) d = (*b == '-') ? -HUGE_VAL : HUGE_VAL;
    else if (r.ec != std::errc() || r.ptr != e) { p_ = start; fail("malformed number"); }
    return Json::number(d);
  }
  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) out += static_cast<char>(cp);
    else if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); out += static_cast<char>(0x80 | (cp & 0x3F)); }
    else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18)); out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  uint32_t parse_hex4() {
    if (p_ + 4 > s_.size()) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[p_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= c - '0';
      else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
      else fail("bad \\u escape");
    }
    return v;
  }
  std::string parse_string() {
    ++p_;  // opening quote
    std::string out;
    while (true) {
      if (p_ >= s_.size()) fail("unterminated string");
      char c = s_[p_];
      if (static_cast<unsigned char>(c) >= 0x80) {
        const size_t len = utf8_sequence();
        if (len == 0) fail(describe_byte(c) + " in a string is not valid UTF-8; save the file as UTF-8");
        out.append(s_.substr(p_, len));
        p_ += len;
        continue;
      }
      ++p_;
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) { --p_; fail("control character in string"); }
      if (c != '\\') { out += c; continue; }
      if (p_ >= s_.size()) fail("unterminated escape");
      char e = s_[p_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp < 0xDC00 && p_ + 6 <= s_.size() && s_[p_] == '\\' && s_[p_ + 1] == 'u') {
            p_ += 2;
            uint32_t lo = parse_hex4();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default: --p_; fail("bad escape character");
      }
    }
    return out;
  }
  Json parse_array(int depth) {
    ++p_;
    Json arr = Json::array();
    skip_ws();
    if (peek() == ']') { ++p_; return arr; }
    while (true) {
      skip_ws();
      arr.arr_.push_back(parse_value(depth + 1));
      skip_ws();
      char c = peek();
      if (c == ',') { ++p_; continue; }
      if (c == ']') { ++p_; break; }
      fail("expected ',' or ']' in array" + found());
    }
    return arr;
  }
  Json parse_object(int depth) {
    ++p_;
    Json obj = Json::object();
    skip_ws();
    if (peek() == '}') { ++p_; return obj; }
    while (true) {
      skip_ws();
      if (peek() != '"') fail("expected a string key in object" + found());
      std::string key = parse_string();
      skip_ws();
      if (peek() != ':') fail("expected ':' after object key" + found());
      ++p_;
      skip_ws();
      const std::string* outer = key_;
      key_ = &key;
      Json value = parse_value(depth + 1);
      key_ = outer;
      obj.obj_.emplace_back(std::move(key), std::move(value));
      skip_ws();
      char c = peek();
      if (c == ',') { ++p_; continue; }
      if (c == '}') { ++p_; break; }
      fail("expected ',' or '}' in object" + found());
    }
    return obj;
  }
};

Json parse_json(std::string_view text) { return JsonParser(text).parse_document(); }

// ----------------------------------------------------------------------------- writer
static void dump_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) { char buf[8]; std::snprintf(buf, sizeof buf, "\\u%04x", c); out += buf; }
        else out += static_cast<char>(c);
    }
  }
  out += '"';
}

static void dump_value(std::string& out, const Json& v, int indent, int level) {
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.kind()) {
    case Json::Kind::Null: out += "null"; break;
    case Json::Kind::Bool: out += v.as_bool() ? "true" : "false"; break;
    case Json::Kind::Number: {
      if (v.is_integer()) { out += std::to_string(v.as_int()); break; }
      double d = v.as_double();
      if (!std::isfinite(d)) { out += d > 0 ? "1e308" : (d < 0 ? "-1e308" : "null"); break; }
      char buf[32];
      auto r = std::to_chars(buf, buf + sizeof buf, d);
      out.append(buf, r.ptr);
      break;
    }
    case Json::Kind::String: dump_string(out, v.as_string()); break;
    case Json::Kind::Array: {
      const auto& a = v.as_array();
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        dump_value(out, a[i], indent, level + 1);
      }
      if (!a.empty()) newline(level);
      out += ']';
      break;
    }
    case Json::Kind::Object: {
      const auto& o = v.items();
      out += '{';
      for (size_t i = 0; i < o.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        dump_string(out, o[i].first);
        out += indent < 0 ? ":" : ": ";
        dump_value(out, o[i].second, indent, level + 1);
      }
      if (!o.empty()) newline(level);
      out += '}';
      break;
    }
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_value(out, *this, indent, 0);
  return out;
}

// ----------------------------------------------------------------------------- files
std::string read_file_maybe_gzip(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error("'" + path + "' is a directory, not a file; pass the JSON file itself");
  std::ifstream probe(path, std::ios::binary);
  if (!probe) throw std::runtime_error("cannot open file '" + path + "': " + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  probe.read(reinterpret_cast<char*>(magic), 2);
  bool gz = probe.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  probe.close();
  if (!gz) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw std::runtime_error("error while reading '" + path + "': " + std::strerror(errno));
    return ss.str();
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open gzip file '" + path + "'");
  gzbuffer(f, 1 << 20);
  std::string out;
  std::vector<char> buf(1 << 20);
  while (true) {
    int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw std::runtime_error("'" + path + "' is not a valid gzip file: " + msg);
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  // gzread returns what it could decompress and stops quietly at a cut-off stream; zlib
  // records that as Z_BUF_ERROR, which would otherwise pass a partial file as whole.
  int err = Z_OK;
  std::string msg = gzerror(f, &err);
  gzclose(f);
  if (err != Z_OK)
    throw std::runtime_error("'" + path + "' is a truncated or damaged gzip file (" + msg +
                             " after " + std::to_string(out.size()) + " decompressed bytes); copy or download it again");
  return out;
}

}  // namespace autoshard
