// The JSON document type of every format autoshard reads and writes (nlohmann/json), and the
// checked accessors its readers use. Only cpp/src/io, the command line and the Python
// bindings include this: stages take and return plain structs.
//
// Objects keep their key order (ordered_json): written files read in a natural order, and a
// graph's kwargs keep the order that fixes the plan's tensor-input order.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace autoshard {

using Json = nlohmann::ordered_json;

// Raised for malformed JSON and for a document whose shape does not match what a reader
// expects. `what()` names the place: a line/column for syntax, a path such as
// "problem.edges.costs[3]" for shape errors, because a user's malformed file must get a
// message that says where it is wrong.
class JsonError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses a whole document. Syntax errors become JsonError "invalid JSON at line L, column C:
// ..." with the cases users meet named plainly (empty input, NaN/Infinity from Python's
// json.dumps, bytes that are not UTF-8, a file cut short); nesting deeper than 512 levels is
// refused (readers recurse over argument lists).
Json parse_json(std::string_view text);

// Compact (indent < 0) or indented text; strings are written as UTF-8 (never \u-escaped).
std::string dump_json(const Json& j, int indent = -1);

// A number to write: integral values below 2^53 as integers ("12", as the hand-written
// writer did, so Python reads ints where it always has), others in the shortest form that
// reads back to the same double; infinities as +-1e308 (JSON has none).
Json json_number(double d);

// "null", "bool", "number", "string", "array", "object", for messages.
const char* json_kind_name(const Json& j);

// Checked accessors: `where` names the value in error messages ("expected an integer, found
// string"). json_int accepts a float with an integral value (5.0), as Python may write one.
bool json_bool(const Json& j, std::string_view where = "value");
double json_double(const Json& j, std::string_view where = "value");
int64_t json_int(const Json& j, std::string_view where = "value");
// The integer a float stands for when json_int accepts it (integral, within 64 bits).
std::optional<int64_t> json_integral_double(double d);
// True for a number written as an integer that fits in int64 (the text's own kind).
bool json_is_int64(const Json& j);
const std::string& json_string(const Json& j, std::string_view where = "value");
const Json::array_t& json_array(const Json& j, std::string_view where = "value");
// The object's (key, value) pairs in order; throws unless `j` is an object.
const Json::object_t& json_items(const Json& j, std::string_view where = "object");
// A key of an object: json_find returns nullptr when absent (or when `j` is no object),
// json_at throws naming `where` and the key.
const Json* json_find(const Json& j, std::string_view key);
const Json& json_at(const Json& j, std::string_view key, std::string_view where = "object");

}  // namespace autoshard
