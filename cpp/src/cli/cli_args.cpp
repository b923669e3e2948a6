// CLI11 set up alike for every subcommand, and the one conversion of option texts to numbers.
#include "cli_args.h"

#include <algorithm>
#include <charconv>
#include <stdexcept>

namespace autoshard::cli {

void configure(CLI::App& app) {
  // Texts, not typed options: conversion errors must name the option and its value, which
  // CLI11's own messages do not do in the form users of this command know.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();
  app.get_formatter()->column_width(26);
}

bool parse(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    return false;
  } catch (const CLI::ParseError& e) {
    throw UsageError{e.what()};
  }
  return true;
}

void reject_extras(const CLI::App& app, const std::string& first_positional, const std::string& what) {
  for (const std::string& a : app.remaining()) {
    if (!a.empty() && a[0] == '-') throw UsageError{"unknown option '" + a + "'"};
    throw UsageError{"more than one " + what + " given ('" + first_positional + "' and '" + a + "')"};
  }
}

namespace {

template <class T>
T to_number(const std::string& text, const std::string& option, const std::string& noun) {
  T v{};
  auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size())
    throw std::invalid_argument(option + " expects " + noun + ", got '" + text + "'");
  return v;
}

}  // namespace

double to_double(const std::string& text, const std::string& option, const std::string& noun) {
  return to_number<double>(text, option, noun);
}

int64_t to_int(const std::string& text, const std::string& option) {
  return to_number<int64_t>(text, option, "an integer");
}

}  // namespace autoshard::cli
