// JSON as a stream of events (RapidJSON's reader) for readers that build their result as the
// text arrives, without a document tree. RapidJSON's event reader parses the 1.5 GB planner
// problem files at ~450 MB/s, where nlohmann's SAX lexer managed ~130 MB/s; handlers that
// read rows of numbers in place with json_numbers (io/json_numbers.h) go about twice as
// fast. nlohmann stays the tree parser (io/json.h), whose messages the readers fall back to.
//
// Handler: RapidJSON's handler interface (Null, Bool, Int, Uint, Int64, Uint64, Double,
// String, StartObject, Key, EndObject, StartArray, EndArray; RawNumber is never called). A
// handler returning false stops the parse.
#pragma once

#include <rapidjson/reader.h>

#include <cstddef>
#include <cstring>
#include <streambuf>
#include <string_view>
#include <vector>

namespace autoshard::detail {

// A RapidJSON input stream over text in memory or, block by block, over a stream buffer
// (sgetn, unlike istream::read, lets an exception of the buffer through: the gzip pipe's
// "damaged file" errors reach the caller).
class JsonInput {
 public:
  using Ch = char;
  explicit JsonInput(std::string_view text) : start_(text.data()), cur_(text.data()), end_(text.data() + text.size()) {}
  explicit JsonInput(std::streambuf& source) : source_(&source), block_(kBlock) { refill(); }

  Ch Peek() const { return cur_ < end_ ? *cur_ : '\0'; }
  Ch Take() {
    if (cur_ + 1 < end_) [[likely]]
      return *cur_++;
    return take_last();
  }
  size_t Tell() const { return done_ + static_cast<size_t>(cur_ - start_); }
  // Whether every byte was read: the reader takes a NUL byte for the end of the text.
  bool at_end() const { return cur_ == end_; }

  // The text in hand from the current position, at least `n` bytes of it unless the text ends
  // first (a stream moves the rest of its block to the front and reads on), for scanners that
  // read a run of bytes in place (json_numbers).
  std::string_view window(size_t n) {
    if (static_cast<size_t>(end_ - cur_) < n && source_) [[unlikely]]
      fill(n);
    return {cur_, static_cast<size_t>(end_ - cur_)};
  }
  // Moves past `n` bytes of the window.
  void skip(size_t n) {
    cur_ += n;
    if (cur_ == end_ && source_) refill();
  }

  // Output side of RapidJSON's stream concept; the reader never writes (no in-situ parsing).
  Ch* PutBegin() { return nullptr; }
  void Put(Ch) {}
  void Flush() {}
  size_t PutEnd(Ch*) { return 0; }

 private:
  static constexpr size_t kBlock = size_t(1) << 16;
  // The last byte in hand (then the next block), or the end. Out of line, so that Take, called
  // for every byte, stays small enough to inline.
  [[gnu::noinline]] Ch take_last() {
    if (cur_ == end_) return '\0';
    const Ch c = *cur_++;
    if (source_) refill();
    return c;
  }
  void refill() {
    done_ += static_cast<size_t>(end_ - start_);
    const std::streamsize n = source_->sgetn(block_.data(), static_cast<std::streamsize>(block_.size()));
    start_ = cur_ = block_.data();
    end_ = cur_ + (n > 0 ? n : 0);
  }
  [[gnu::noinline]] void fill(size_t n) {
    const size_t left = static_cast<size_t>(end_ - cur_);
    done_ += static_cast<size_t>(cur_ - start_);
    std::memmove(block_.data(), cur_, left);
    start_ = cur_ = block_.data();
    end_ = cur_ + left;
    while (static_cast<size_t>(end_ - cur_) < n) {
      const std::streamsize got =
          source_->sgetn(block_.data() + (end_ - cur_), static_cast<std::streamsize>(block_.size()) - (end_ - cur_));
      if (got <= 0) break;
      end_ += got;
    }
  }

  const Ch* start_ = nullptr;  // the text in hand: [start_, end_), read up to cur_
  const Ch* cur_ = nullptr;
  const Ch* end_ = nullptr;
  size_t done_ = 0;  // bytes of earlier blocks
  std::streambuf* source_ = nullptr;
  std::vector<char> block_;
};

// Feeds `handler` the events of `input`; true when the whole input is one well-formed JSON
// value (strict: valid UTF-8 in strings, correctly rounded doubles, nothing after the value)
// and the handler accepted every event.
//
// The reader recurses (no kParseIterativeFlag): it calls StartArray after taking the '[', as
// json_numbers needs, where the iterative reader calls it before. Its depth is the handler's
// to bound: a handler refusing nesting deeper than some limit keeps the stack small.
template <class Handler>
bool json_events(JsonInput& input, Handler& handler) {
  constexpr unsigned kFlags = rapidjson::kParseFullPrecisionFlag | rapidjson::kParseValidateEncodingFlag;
  rapidjson::Reader reader;
  return !reader.Parse<kFlags>(input, handler).IsError() && input.at_end();
}

}  // namespace autoshard::detail
