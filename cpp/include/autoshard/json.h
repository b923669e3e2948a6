// A small JSON document model and parser shared by every reader in autoshard (solver
// problems, tensor graphs, plans). Errors name the line and column of the bad input, because
// a user's malformed file must get a message that says where it is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace autoshard {

// Raised for malformed JSON and for a document whose shape does not match what a reader
// expects. `what()` names the place: a line/column for syntax, a path such as
// "problem.edges.costs[3]" for shape errors.
class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Json {
 public:
  enum class Kind { Null, Bool, Number, String, Array, Object };

  Json() = default;
  static Json null() { return Json(); }
  static Json boolean(bool b);
  static Json number(double d);
  static Json integer(int64_t i);
  static Json string(std::string s);
  static Json array(std::vector<Json> items = {});
  static Json object();

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_number() const { return kind_ == Kind::Number; }
  bool is_integer() const { return kind_ == Kind::Number && is_int_; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }
  bool is_bool() const { return kind_ == Kind::Bool; }

  // Checked accessors: `where` names the value in error messages.
  bool as_bool(std::string_view where = "value") const;
  double as_double(std::string_view where = "value") const;
  int64_t as_int(std::string_view where = "value") const;
  const std::string& as_string(std::string_view where = "value") const;
  const std::vector<Json>& as_array(std::string_view where = "value") const;
  std::vector<Json>& as_array_mut();

  // Objects keep insertion order (so written files read naturally).
  const Json* find(std::string_view key) const;
  const Json& at(std::string_view key, std::string_view where = "object") const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }
  Json& set(std::string key, Json value);
  const std::vector<std::pair<std::string, Json>>& items(std::string_view where = "object") const;
  void push_back(Json value);
  size_t size() const;

  std::string dump(int indent = -1) const;

 private:
  friend class JsonParser;
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  bool is_int_ = false;
  int64_t int_ = 0;
  double num_ = 0.0;
  std::string str_;
  std::vector<Json> arr_;
  std::vector<std::pair<std::string, Json>> obj_;
};

// Parses a whole document; trailing non-space characters are an error.
Json parse_json(std::string_view text);

// Reads a file (gzip-compressed when it starts with the gzip magic) into memory.
std::string read_file_maybe_gzip(const std::string& path);

// Human-readable kind name, for messages.
const char* json_kind_name(Json::Kind k);

}  // namespace autoshard
