// The op rule registry: op overload name -> OpRule. Rules register from their family files
// (cpp/src/rules/<family>.cpp) through RuleRegistrar or register_<family>_rules().
#include <map>
#include <mutex>
#include <stdexcept>

#include "autoshard/rules.h"

namespace autoshard {

namespace {
struct RegistryState {
  std::mutex mu;
  std::map<std::string, OpRule> rules;  // ordered: ops() is deterministic
};
RegistryState& state() {
  static RegistryState s;
  return s;
}
}  // namespace

RuleRegistry& RuleRegistry::instance() {
  static RuleRegistry r;
  return r;
}

void RuleRegistry::add(const std::string& op, OpRule rule) {
  if (op.empty()) throw std::invalid_argument("RuleRegistry::add: empty op name");
  if (!rule.rows) throw std::invalid_argument("RuleRegistry::add(" + op + "): the rule has no rows function");
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  // A second registration of the same op replaces the first (registration is idempotent
  // when register_all_rules() runs twice).
  s.rules[op] = std::move(rule);
}

const OpRule* RuleRegistry::find(const std::string& op) const {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.rules.find(op);
  return it == s.rules.end() ? nullptr : &it->second;
}

std::vector<std::string> RuleRegistry::ops() const {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<std::string> out;
  for (const auto& [k, v] : s.rules) out.push_back(k);
  return out;
}

}  // namespace autoshard
