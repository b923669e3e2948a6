// JSON numbers read in place from a JsonInput's buffer, for handlers of json_events
// (io/json_events.h) that take whole rows of numbers at once. Each number the scanner takes
// has the value RapidJSON's reader would give it; whatever it cannot be sure of is left to
// the reader.
#pragma once

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

#include "io/json_events.h"

namespace autoshard::detail {

// A JSON number -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? read in place, for json_numbers.
struct ScannedNumber {
  enum Kind : uint8_t {
    Integer,  // `integer`: no fraction, no exponent, below 2^63 in size
    Real,     // `real`, correctly rounded
    Invalid,  // the bytes are not a JSON number, or one is followed by more number bytes
    Reader    // a number left to RapidJSON's reader: longer than allowed, or beyond range
  } kind = Invalid;
  size_t length = 0;
  int64_t integer = 0;
  double real = 0;
};

namespace numbers {
// The value of 8 ASCII digits at `p`, or -1 if they are not all digits: the bytes' values are
// paired (10a + b), then the pairs (100ab + cd), then the quads, a few multiplies in all
// instead of a chain of eight.
inline int64_t eight_digits(const char* p) {
  static_assert(std::endian::native == std::endian::little);
  uint64_t x;
  std::memcpy(&x, p, 8);
  constexpr uint64_t kOnes = 0x0101010101010101;
  // Each byte in 0x30..0x39: its high nibble is 3, and adding 6 keeps it 3.
  if ((x & 0xF0 * kOnes) != 0x30 * kOnes || ((x + 6 * kOnes) & 0xF0 * kOnes) != 0x30 * kOnes) return -1;
  x -= 0x30 * kOnes;                               // byte i: digit i (the first digit is the lowest byte)
  x = x * 10 + (x >> 8);                           // even bytes: 10 d[i] + d[i+1]
  constexpr uint64_t kPairs = 0x000000FF000000FF;  // bytes 0 and 4 (then, shifted, 2 and 6)
  return static_cast<int64_t>(
      ((x & kPairs) * (100 + (1000000ull << 32)) + ((x >> 16) & kPairs) * (1 + (10000ull << 32))) >> 32);
}

// Moves `p` past the digits before `end`, accumulating them into `m` (modulo 2^64).
inline const char* digits(const char* p, const char* end, uint64_t& m) {
  for (int64_t v; end - p >= 8 && (v = eight_digits(p)) >= 0; p += 8) m = m * 100000000 + static_cast<uint64_t>(v);
  for (; p < end && *p >= '0' && *p <= '9'; ++p) m = m * 10 + static_cast<uint64_t>(*p - '0');
  return p;
}

inline bool number_byte(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '.' || c == 'e' || c == 'E' || c == '+';
}
}  // namespace numbers

// The number at the start of `w` (which starts with '-' or a digit), judged within the first
// `max_length` + 1 bytes, into `out` (filled field by field: a returned struct was copied
// through the stack at a cost of ~30 % of the scan).
inline void scan_json_number(std::string_view w, size_t max_length, ScannedNumber& out) {
  out.kind = ScannedNumber::Invalid;
  const char* const start = w.data();
  const char* const end = start + std::min(w.size(), max_length + 1);
  const bool minus = *start == '-';
  const char* p = start + minus;
  uint64_t m = 0;  // the digits of the integer part and the fraction
  const char* const int_start = p;
  p = numbers::digits(p, end, m);
  const size_t int_digits = static_cast<size_t>(p - int_start);
  if (int_digits == 0 || (int_digits > 1 && *int_start == '0')) return;
  size_t frac_digits = 0;
  bool integral = true;
  if (p < end && *p == '.') {
    integral = false;
    const char* const frac_start = ++p;
    p = numbers::digits(p, end, m);
    frac_digits = static_cast<size_t>(p - frac_start);
    if (frac_digits == 0) return;
  }
  int exponent = 0;
  if (p < end && (*p == 'e' || *p == 'E')) {
    integral = false;
    const bool exp_minus = ++p < end && *p == '-';
    if (p < end && (*p == '-' || *p == '+')) ++p;
    const char* const exp_start = p;
    for (; p < end && *p >= '0' && *p <= '9'; ++p) exponent = std::min(exponent * 10 + (*p - '0'), 100000);
    if (p == exp_start) return;
    if (exp_minus) exponent = -exponent;
  }
  if (p == end && w.size() > max_length) {  // it may go on
    out.kind = ScannedNumber::Reader;
    return;
  }
  if (p < end && numbers::number_byte(*p)) return;
  out.length = static_cast<size_t>(p - start);
  if (integral) {
    if (int_digits > 19 || m > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      out.kind = ScannedNumber::Reader;
      return;
    }
    out.kind = ScannedNumber::Integer;
    out.integer = minus ? -static_cast<int64_t>(m) : static_cast<int64_t>(m);
    return;
  }
  // Clinger's fast path: an integer below 2^53 times or over a power of ten up to 10^22, all
  // exact in a double, is one correctly rounded operation. The rest go to std::from_chars.
  static constexpr double kPow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                      1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  const int e10 = exponent - static_cast<int>(frac_digits);
  if (int_digits + frac_digits <= 19 && m <= (uint64_t(1) << 53) && e10 >= -22 && e10 <= 22) {
    const double d = static_cast<double>(m);
    out.real = e10 < 0 ? d / kPow10[-e10] : d * kPow10[e10];
    if (minus) out.real = -out.real;
  } else {
    const auto [last, ec] = std::from_chars(start, p, out.real);
    if (ec != std::errc() || last != p) {
      out.kind = ScannedNumber::Reader;
      return;
    }
  }
  out.kind = ScannedNumber::Real;
}

// Reads the numbers of an array whose '[' was just read, in place and without RapidJSON's
// byte-by-byte stream calls: rows of numbers are nearly all of a problem file's bytes.
// Each number goes to `handler` as the reader would pass it: an integer below 2^63 in size
// as Int64, one with a fraction or an exponent as Double, correctly rounded as by the
// reader's full-precision mode.
//
// Returns false when the text is not well-formed JSON there, so that the parse fails (as
// when the handler returns false). Otherwise the input is left where the reader goes on as
// if the array had just opened: at its ']'; or, after its comma, at a number this scanner
// leaves to the reader (an integer of 2^63 or more in size, over kMaxNumber bytes, beyond a
// double's range); or at a first element that is not a number (a nested array, say), for
// the reader and its handler.
template <class Handler>
bool json_numbers(JsonInput& input, Handler& handler) {
  constexpr size_t kMaxNumber = 40;
  const auto is_space = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  const auto starts_number = [](std::string_view w) {
    return !w.empty() && (w[0] == '-' || (w[0] >= '0' && w[0] <= '9'));
  };
  // Skips white space; then the window from the next byte, kMaxNumber + 1 bytes of it in hand
  // unless the text ends first.
  const auto next_token = [&] {
    while (true) {
      const std::string_view w = input.window(kMaxNumber + 1);
      size_t i = 0;
      while (i < w.size() && is_space(w[i])) ++i;
      if (i == 0) return w;
      input.skip(i);
    }
  };
  ScannedNumber n;
  for (bool first = true;; first = false) {
    std::string_view w = next_token();
    if (!first) {
      if (w.empty() || w[0] != ',') return !w.empty() && w[0] == ']';
      // The comma is taken only before a number: the reader must see "1, ]" or "1, [" whole.
      input.skip(1);
      w = next_token();
      if (!starts_number(w)) return false;
    } else if (!starts_number(w)) {
      return true;
    }
    scan_json_number(w, kMaxNumber, n);
    switch (n.kind) {
      case ScannedNumber::Integer:
        if (!handler.Int64(n.integer)) return false;
        break;
      case ScannedNumber::Real:
        if (!handler.Double(n.real)) return false;
        break;
      case ScannedNumber::Invalid:
        return false;
      case ScannedNumber::Reader:
        return true;
    }
    input.skip(n.length);
  }
}

}  // namespace autoshard::detail
