// IOPDDL problem reader/writer: every error names the file, the field and the fix.
#include "io/problem_json.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <istream>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "autoshard/problem_io.h"
#include "io/json_events.h"
#include "io/json_numbers.h"
#include "io/read_file.h"

namespace autoshard {

namespace {

std::string idx(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

// Every message starts with the source so that a user with many files knows which one.
[[noreturn]] void fail(const std::string& source, const std::string& msg) { throw ProblemError(source + ": " + msg); }

// Wraps the Json accessors so their JsonError becomes a ProblemError with the source.
template <class F>
auto guarded(const std::string& source, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const JsonError& e) {
    fail(source, e.what());
  }
}

const Json& require(const Json& obj, const char* key, const std::string& where, const std::string& source) {
  if (!obj.is_object()) fail(source, where + ": expected an object, found " + json_kind_name(obj));
  const Json* v = json_find(obj, key);
  if (!v) fail(source, where + ": missing key \"" + key + "\"");
  return *v;
}

const std::vector<Json>& array_of(const Json& v, const std::string& where, const std::string& source) {
  if (!v.is_array()) fail(source, where + ": expected an array, found " + json_kind_name(v));
  return json_array(v);
}

// The cost rules below, shared by the tree reader (which words the errors) and the event
// reader (which only needs to know whether a value is accepted).
// An integer cost: 1e18 and above mean "infeasible"; below, it must be exact in a double.
bool int_cost_exact(int64_t c) {
  if (c >= 1000000000000000000LL) return true;
  return static_cast<Cost>(c < 0 ? -c : c) <= kMaxExactCost;
}
// A cost written as a float: finite and within 64 bits ...
bool float_cost_fits(double d) { return std::isfinite(d) && std::fabs(d) < 9.2e18; }
// ... and exact in a double unless infeasible.
bool float_cost_exact(double d) { return is_infeasible(d) || std::fabs(d) <= kMaxExactCost; }

// Costs: any finite number that fits a 64-bit integer range (IOPDDL costs are integers; the
// PyTorch path writes microseconds). Values >= 1e18 mean "infeasible" and are kept as is.
// Integers are taken from the JSON text exactly: between 2^53 and 1e18 they would round in the
// solver's doubles (999999999999999999 would become 1e18, "infeasible"), so they are refused.
Cost read_cost(const Json& v, const std::string& where, const std::string& source) {
  if (!v.is_number()) fail(source, where + ": expected a number, found " + json_kind_name(v));
  const std::string fix =
      "; costs of 1e18 (1000000000000000000) and above mean 'infeasible', finite costs must stay within "
      "+-2^53 = 9007199254740992 (the solver works in doubles, exact for integers up to there): divide every "
      "cost by a common factor";
  if (json_is_int64(v)) {
    const int64_t c = json_int(v);
    if (!int_cost_exact(c))
      fail(source, where + ": cost " + std::to_string(c) + " cannot be represented exactly" + fix);
    return static_cast<Cost>(c);
  }
  double d = json_double(v);
  char text[32];
  auto r = std::to_chars(text, text + sizeof text, d);
  const std::string shown(text, r.ptr);
  if (!float_cost_fits(d))
    fail(source, where + ": cost " + shown +
                     " does not fit in 64 bits; write infeasible choices as 1000000000000000000 (1e18)");
  if (!float_cost_exact(d)) fail(source, where + ": cost " + shown + " cannot be represented exactly" + fix);
  return d;
}

int64_t read_int(const Json& v, const std::string& where, const std::string& source) {
  return guarded(source, [&] { return json_int(v, where); });
}

int64_t read_usage(const Json& v, const std::string& where, const std::string& source) {
  int64_t u = read_int(v, where, source);
  if (u < 0) fail(source, where + ": negative usage " + std::to_string(u) + "; usages are bytes (>= 0)");
  return u;
}

}  // namespace

Problem problem_from_json(const Json& doc, const std::string& source) {
  Problem p;
  if (!doc.is_object())
    fail(source,
         std::string("expected a JSON object {\"problem\": {...}} at the top level, found ") + json_kind_name(doc));
  const Json* root = json_find(doc, "problem");
  if (!root)
    fail(source, "missing top-level key \"problem\" (IOPDDL format: {\"problem\": {\"nodes\": ..., \"edges\": ...}})");
  const Json& pr = *root;
  if (!pr.is_object()) fail(source, std::string("problem: expected an object, found ") + json_kind_name(pr));

  if (const Json* name = json_find(pr, "name")) {
    if (!name->is_string()) fail(source, "problem.name: expected a string");
    p.name = json_string(*name);
  }
  const Json& nodes = require(pr, "nodes", "problem", source);
  const auto& costs = array_of(require(nodes, "costs", "problem.nodes", source), "problem.nodes.costs", source);
  const size_t n = costs.size();
  p.node_costs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    std::string w = idx("problem.nodes.costs", i);
    const auto& row = array_of(costs[i], w, source);
    if (row.empty())
      fail(source, w + ": node " + std::to_string(i) + " has no strategies; every node needs at least one");
    p.node_costs[i].reserve(row.size());
    for (size_t s = 0; s < row.size(); ++s) p.node_costs[i].push_back(read_cost(row[s], idx(w, s), source));
  }

  const Json* limit = json_find(pr, "usage_limit");
  if (limit && !limit->is_null()) {
    p.usage_limit = read_int(*limit, "problem.usage_limit", source);
    if (p.usage_limit < 0)
      fail(source,
           "problem.usage_limit: negative limit " + std::to_string(p.usage_limit) + "; omit the key for no limit");
  }
  const Json* usages = json_find(nodes, "usages");
  const Json* intervals = json_find(nodes, "intervals");
  if (p.usage_limit >= 0 && !usages)
    fail(source, "problem.nodes: missing key \"usages\" (required with \"usage_limit\")");
  if (p.usage_limit >= 0 && !intervals)
    fail(source, "problem.nodes: missing key \"intervals\" (required with \"usage_limit\")");
  p.node_usages.assign(n, {});
  if (usages) {
    const auto& rows = array_of(*usages, "problem.nodes.usages", source);
    if (rows.size() != n)
      fail(source, "problem.nodes.usages: has " + std::to_string(rows.size()) + " rows but problem.nodes.costs has " +
                       std::to_string(n) + "; give one row per node");
    for (size_t i = 0; i < n; ++i) {
      std::string w = idx("problem.nodes.usages", i);
      const auto& row = array_of(rows[i], w, source);
      if (row.size() != p.node_costs[i].size())
        fail(source, w + ": has " + std::to_string(row.size()) + " entries but node " + std::to_string(i) + " has " +
                         std::to_string(p.node_costs[i].size()) +
                         " strategies in problem.nodes.costs; give one usage per strategy");
      p.node_usages[i].reserve(row.size());
      for (size_t s = 0; s < row.size(); ++s) p.node_usages[i].push_back(read_usage(row[s], idx(w, s), source));
    }
  }
  p.intervals.assign(n, Interval{});
  if (intervals) {
    const auto& rows = array_of(*intervals, "problem.nodes.intervals", source);
    if (rows.size() != n)
      fail(source, "problem.nodes.intervals: has " + std::to_string(rows.size()) +
                       " entries but problem.nodes.costs has " + std::to_string(n) +
                       "; give one [start, end) per node");
    for (size_t i = 0; i < n; ++i) {
      std::string w = idx("problem.nodes.intervals", i);
      const auto& iv = array_of(rows[i], w, source);
      if (iv.size() != 2) fail(source, w + ": expected [start, end], found " + std::to_string(iv.size()) + " numbers");
      p.intervals[i].start = read_int(iv[0], idx(w, 0), source);
      p.intervals[i].end = read_int(iv[1], idx(w, 1), source);
      if (p.intervals[i].end < p.intervals[i].start)
        fail(source, w + ": interval end " + std::to_string(p.intervals[i].end) + " is before its start " +
                         std::to_string(p.intervals[i].start) + " (intervals are [start, end) with end >= start)");
    }
  }
  if (const Json* names = json_find(nodes, "names")) {
    const auto& rows = array_of(*names, "problem.nodes.names", source);
    if (rows.size() != n)
      fail(source, "problem.nodes.names: has " + std::to_string(rows.size()) + " entries, expected one per node (" +
                       std::to_string(n) + ")");
    for (size_t i = 0; i < n; ++i) {
      if (!rows[i].is_string()) fail(source, idx("problem.nodes.names", i) + ": expected a string");
      p.node_names.push_back(json_string(rows[i]));
    }
  }

  const Json& edges = require(pr, "edges", "problem", source);
  const auto& enodes = array_of(require(edges, "nodes", "problem.edges", source), "problem.edges.nodes", source);
  const auto& ecosts = array_of(require(edges, "costs", "problem.edges", source), "problem.edges.costs", source);
  if (enodes.size() != ecosts.size())
    fail(source, "problem.edges: \"nodes\" has " + std::to_string(enodes.size()) + " entries but \"costs\" has " +
                     std::to_string(ecosts.size()) + "; give one cost matrix per edge");
  p.edges.resize(enodes.size());
  for (size_t e = 0; e < enodes.size(); ++e) {
    std::string w = idx("problem.edges.nodes", e);
    const auto& uv = array_of(enodes[e], w, source);
    if (uv.size() != 2) fail(source, w + ": expected [u, v], found " + std::to_string(uv.size()) + " numbers");
    int64_t ends[2];
    for (int k = 0; k < 2; ++k) {
      ends[k] = read_int(uv[k], idx(w, k), source);
      if (ends[k] < 0 || static_cast<size_t>(ends[k]) >= n)
        fail(source, idx(w, k) + ": node id " + std::to_string(ends[k]) + " is out of range (the problem has " +
                         std::to_string(n) + " nodes, ids 0.." + std::to_string(n == 0 ? 0 : n - 1) + ")");
    }
    Edge& edge = p.edges[e];
    edge.u = static_cast<int32_t>(ends[0]);
    edge.v = static_cast<int32_t>(ends[1]);
    std::string wc = idx("problem.edges.costs", e);
    const auto& m = array_of(ecosts[e], wc, source);
    size_t su = p.node_costs[edge.u].size(), sv = p.node_costs[edge.v].size();
    if (m.size() != su * sv)
      fail(source, wc + ": edge " + std::to_string(e) + " (" + std::to_string(edge.u) + " -> " +
                       std::to_string(edge.v) + ") has " + std::to_string(m.size()) +
                       " costs but needs |S_u| x |S_v| = " + std::to_string(su) + " x " + std::to_string(sv) + " = " +
                       std::to_string(su * sv) + " (row-major)");
    edge.costs.reserve(m.size());
    for (size_t k = 0; k < m.size(); ++k) edge.costs.push_back(read_cost(m[k], idx(wc, k), source));
  }

  if (const Json* budgets = json_find(pr, "budgets")) {
    const auto& list = array_of(*budgets, "problem.budgets", source);
    for (size_t b = 0; b < list.size(); ++b) {
      std::string w = idx("problem.budgets", b);
      GlobalBudget g;
      if (const Json* nm = json_find(list[b], "name")) {
        if (!nm->is_string()) fail(source, w + ".name: expected a string");
        g.name = json_string(*nm);
      }
      const auto& rows = array_of(require(list[b], "usages", w, source), w + ".usages", source);
      if (rows.size() != n)
        fail(source, w + ".usages: has " + std::to_string(rows.size()) + " rows, expected one per node (" +
                         std::to_string(n) + ")");
      g.usage.resize(n);
      for (size_t i = 0; i < n; ++i) {
        std::string wr = idx(w + ".usages", i);
        const auto& row = array_of(rows[i], wr, source);
        if (!row.empty() && row.size() != p.node_costs[i].size())
          fail(source, wr + ": has " + std::to_string(row.size()) + " entries but node " + std::to_string(i) + " has " +
                           std::to_string(p.node_costs[i].size()) + " strategies (use [] for all zero)");
        for (size_t s = 0; s < row.size(); ++s) g.usage[i].push_back(read_usage(row[s], idx(wr, s), source));
      }
      if (const Json* lo = json_find(list[b], "low")) g.low = read_int(*lo, w + ".low", source);
      if (const Json* hi = json_find(list[b], "high")) g.high = read_int(*hi, w + ".high", source);
      if (g.low > g.high)
        fail(source,
             w + ": low " + std::to_string(g.low) + " > high " + std::to_string(g.high) + "; no plan can satisfy it");
      p.budgets.push_back(std::move(g));
    }
  }
  validate_problem(p, source);
  return p;
}

namespace {

// The event reader: JSON events (io/json_events.h) straight into a Problem, without the
// document tree the reader above walks (that tree costs ~0.6 s on a 93 MB problem file). It
// accepts only what the tree reader accepts and builds the same Problem from it; at anything
// else (a syntax error, a value of the wrong kind, a repeated key, a failed check) it gives
// up, and the text is read again by the tree reader, whose checks word the error. So both
// readers give the same results and the same messages, and the rules for costs and integers
// are the shared ones above.
class ProblemEvents {
 public:
  // `input`: the text the events come from; rows of numbers are read from it directly.
  explicit ProblemEvents(detail::JsonInput& input) : input_(input) {}
  // The problem, or nothing when the tree reader must decide.
  std::optional<Problem> finish();

  // The handler interface of json_events (RapidJSON's).
  bool Null() { return slot() == Slot::Ignore || slot() == Slot::UsageLimit; }
  bool Bool(bool) { return slot() == Slot::Ignore; }
  bool Int(int v) { return integer(v); }
  bool Uint(unsigned v) { return integer(v); }
  bool Int64(int64_t v) { return integer(v); }
  bool Uint64(uint64_t v) {
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return slot() == Slot::Ignore;
    return integer(static_cast<int64_t>(v));
  }
  bool Double(double d);
  bool RawNumber(const char*, rapidjson::SizeType, bool) { return false; }
  bool String(const char* s, rapidjson::SizeType n, bool) { return string(std::string(s, n)); }
  bool StartObject();
  bool Key(const char* s, rapidjson::SizeType n, bool) { return key(std::string_view(s, n)); }
  bool EndObject(rapidjson::SizeType) { return pop(); }
  bool StartArray();
  bool EndArray(rapidjson::SizeType);

 private:
  // What the next value is: a field of a known object, an element of a known array, or
  // something the reader ignores (unknown keys, as the tree reader ignores them).
  enum class Slot : uint8_t {
    Doc,
    Problem,
    Name,
    Nodes,
    Edges,
    UsageLimit,
    Budgets,  // document, problem
    NodeCosts,
    NodeUsages,
    Intervals,
    Names,
    EdgeNodes,
    EdgeCosts,  // lists of rows
    BudgetName,
    BudgetUsages,
    Low,
    High,  // a budget's fields
    Budget,
    Row,
    Number,
    NameItem,
    Ignore,
    Bad  // elements
  };
  enum class Frame : uint8_t {
    DocObj,
    ProblemObj,
    NodesObj,
    EdgesObj,
    BudgetObj,
    BudgetsArr,
    RowsArr,
    RowArr,
    NamesArr,
    Skip
  };
  struct Level {
    Frame frame;
    Slot list;          // RowsArr, RowArr: which list of rows
    uint32_t seen = 0;  // objects: the known keys met so far (a repeated one goes to the tree reader)
  };
  struct Budget {
    GlobalBudget g;
    bool has_usages = false;
  };

  Slot slot() const {
    if (stack_.empty()) return Slot::Doc;
    switch (stack_.back().frame) {
      case Frame::BudgetsArr:
        return Slot::Budget;
      case Frame::RowsArr:
        return Slot::Row;
      case Frame::RowArr:
        return Slot::Number;
      case Frame::NamesArr:
        return Slot::NameItem;
      case Frame::Skip:
        return Slot::Ignore;
      default:
        return next_;
    }
  }
  bool push(Frame f, Slot list = Slot::Bad) {
    if (stack_.size() >= 512) return false;  // the tree reader refuses deep nesting
    stack_.push_back({f, list});
    return true;
  }
  bool pop() {
    stack_.pop_back();
    return true;
  }
  static bool is_list(Slot s) {
    return (s >= Slot::NodeCosts && s <= Slot::EdgeCosts && s != Slot::Names) || s == Slot::BudgetUsages;
  }
  static bool is_cost_list(Slot s) { return s == Slot::NodeCosts || s == Slot::EdgeCosts; }
  void start_row(Slot list);
  bool integer(int64_t v);
  bool int_value(int64_t v);
  bool string(std::string v);
  bool key(std::string_view k);
  bool cost_value(Cost c) {
    cost_row_.push_back(c);
    return true;
  }

  detail::JsonInput& input_;
  std::vector<Level> stack_;
  Slot next_ = Slot::Bad;
  std::vector<Cost> cost_row_;
  std::vector<int64_t> int_row_;

  Problem p_;
  bool has_problem_ = false, has_nodes_ = false, has_edges_ = false;
  bool has_costs_ = false, has_usages_ = false, has_intervals_ = false, has_names_ = false;
  bool has_enodes_ = false, has_ecosts_ = false;
  std::vector<std::vector<int64_t>> usages_;
  std::vector<Interval> intervals_;
  std::vector<std::pair<int64_t, int64_t>> enodes_;
  std::vector<std::vector<Cost>> ecosts_;
  std::vector<Budget> budgets_;
};

// A row of `list` begins. An edge's table gets its own vector at the size its nodes give when
// they came first (as problem writers put them), so it is filled in place and moved whole.
void ProblemEvents::start_row(Slot list) {
  int_row_.clear();
  if (list != Slot::EdgeCosts) {
    cost_row_.clear();
    return;
  }
  cost_row_ = {};
  const size_t e = ecosts_.size(), n = p_.node_costs.size();
  if (e < enodes_.size()) {
    const auto [u, v] = enodes_[e];
    if (u >= 0 && v >= 0 && static_cast<size_t>(u) < n && static_cast<size_t>(v) < n)
      cost_row_.reserve(p_.node_costs[u].size() * p_.node_costs[v].size());
  }
}

bool ProblemEvents::integer(int64_t v) {
  const Slot s = slot();
  if (s == Slot::Ignore) return true;
  if (s == Slot::Number && is_cost_list(stack_.back().list)) {
    // -INT64_MIN has no value; the tree reader decides that one.
    if (v == std::numeric_limits<int64_t>::min() || !int_cost_exact(v)) return false;
    return cost_value(static_cast<Cost>(v));
  }
  return int_value(v);
}

bool ProblemEvents::Double(double d) {
  const Slot s = slot();
  if (s == Slot::Ignore) return true;
  if (s == Slot::Number && is_cost_list(stack_.back().list)) {
    if (!float_cost_fits(d) || !float_cost_exact(d)) return false;
    return cost_value(d);
  }
  const auto i = json_integral_double(d);
  return i && int_value(*i);
}

// An integer field or an element of a row of integers.
bool ProblemEvents::int_value(int64_t v) {
  switch (slot()) {
    case Slot::UsageLimit:
      if (v < 0) return false;
      p_.usage_limit = v;
      return true;
    case Slot::Low:
      budgets_.back().g.low = v;
      return true;
    case Slot::High:
      budgets_.back().g.high = v;
      return true;
    case Slot::Number: {
      const Slot list = stack_.back().list;
      if ((list == Slot::NodeUsages || list == Slot::BudgetUsages) && v < 0) return false;
      int_row_.push_back(v);
      return true;
    }
    default:
      return false;
  }
}

bool ProblemEvents::string(std::string v) {
  switch (slot()) {
    case Slot::Ignore:
      return true;
    case Slot::Name:
      p_.name = std::move(v);
      return true;
    case Slot::BudgetName:
      budgets_.back().g.name = std::move(v);
      return true;
    case Slot::NameItem:
      p_.node_names.push_back(std::move(v));
      return true;
    default:
      return false;
  }
}

bool ProblemEvents::StartObject() {
  switch (slot()) {
    case Slot::Doc:
      return push(Frame::DocObj);
    case Slot::Problem:
      has_problem_ = true;
      return push(Frame::ProblemObj);
    case Slot::Nodes:
      has_nodes_ = true;
      return push(Frame::NodesObj);
    case Slot::Edges:
      has_edges_ = true;
      return push(Frame::EdgesObj);
    case Slot::Budget:
      budgets_.emplace_back();
      return push(Frame::BudgetObj);
    case Slot::Ignore:
      return push(Frame::Skip);
    default:
      return false;
  }
}

bool ProblemEvents::key(std::string_view k) {
  Level& top = stack_.back();
  Slot s = Slot::Ignore;
  switch (top.frame) {
    case Frame::DocObj:
      if (k == "problem") s = Slot::Problem;
      break;
    case Frame::ProblemObj:
      if (k == "name")
        s = Slot::Name;
      else if (k == "nodes")
        s = Slot::Nodes;
      else if (k == "edges")
        s = Slot::Edges;
      else if (k == "usage_limit")
        s = Slot::UsageLimit;
      else if (k == "budgets")
        s = Slot::Budgets;
      break;
    case Frame::NodesObj:
      if (k == "costs")
        s = Slot::NodeCosts;
      else if (k == "usages")
        s = Slot::NodeUsages;
      else if (k == "intervals")
        s = Slot::Intervals;
      else if (k == "names")
        s = Slot::Names;
      break;
    case Frame::EdgesObj:
      if (k == "nodes")
        s = Slot::EdgeNodes;
      else if (k == "costs")
        s = Slot::EdgeCosts;
      break;
    case Frame::BudgetObj:
      if (k == "name")
        s = Slot::BudgetName;
      else if (k == "usages")
        s = Slot::BudgetUsages;
      else if (k == "low")
        s = Slot::Low;
      else if (k == "high")
        s = Slot::High;
      break;
    default:
      break;
  }
  if (s != Slot::Ignore) {
    const uint32_t bit = 1u << static_cast<unsigned>(s);
    if (top.seen & bit) return false;
    top.seen |= bit;
  }
  next_ = s;
  return true;
}

bool ProblemEvents::StartArray() {
  const Slot s = slot();
  switch (s) {
    case Slot::Budgets:
      return push(Frame::BudgetsArr);
    case Slot::Names:
      has_names_ = true;
      return push(Frame::NamesArr);
    case Slot::Row:
      start_row(stack_.back().list);
      return push(Frame::RowArr, stack_.back().list) && detail::json_numbers(input_, *this);
    case Slot::Ignore:
      return push(Frame::Skip);
    default:
      if (!is_list(s)) return false;
      if (s == Slot::NodeCosts) has_costs_ = true;
      if (s == Slot::NodeUsages) has_usages_ = true;
      if (s == Slot::Intervals) has_intervals_ = true;
      if (s == Slot::EdgeNodes) has_enodes_ = true;
      if (s == Slot::EdgeCosts) has_ecosts_ = true;
      if (s == Slot::BudgetUsages) budgets_.back().has_usages = true;
      return push(Frame::RowsArr, s);
  }
}

bool ProblemEvents::EndArray(rapidjson::SizeType) {
  const Level top = stack_.back();
  if (top.frame == Frame::RowArr) {
    switch (top.list) {
      case Slot::NodeCosts:
        if (cost_row_.empty()) return false;
        p_.node_costs.emplace_back(cost_row_.begin(), cost_row_.end());
        break;
      case Slot::EdgeCosts:
        // Moved, not copied: edge tables are nearly all of a large problem (1.2 GB of 1.3).
        if (cost_row_.capacity() > cost_row_.size()) cost_row_.shrink_to_fit();
        ecosts_.push_back(std::move(cost_row_));
        break;
      case Slot::NodeUsages:
        usages_.emplace_back(int_row_.begin(), int_row_.end());
        break;
      case Slot::BudgetUsages:
        budgets_.back().g.usage.emplace_back(int_row_.begin(), int_row_.end());
        break;
      case Slot::Intervals:
        if (int_row_.size() != 2 || int_row_[1] < int_row_[0]) return false;
        intervals_.push_back({int_row_[0], int_row_[1]});
        break;
      case Slot::EdgeNodes:
        if (int_row_.size() != 2) return false;
        enodes_.emplace_back(int_row_[0], int_row_[1]);
        break;
      default:
        return false;
    }
  }
  return pop();
}

std::optional<Problem> ProblemEvents::finish() {
  if (!has_problem_ || !has_nodes_ || !has_costs_ || !has_edges_ || !has_enodes_ || !has_ecosts_) return std::nullopt;
  const size_t n = p_.node_costs.size();
  const auto rows_fit = [&](const std::vector<std::vector<int64_t>>& rows, bool empty_ok) {
    if (rows.size() != n) return false;
    for (size_t i = 0; i < n; ++i)
      if (rows[i].size() != p_.node_costs[i].size() && !(empty_ok && rows[i].empty())) return false;
    return true;
  };
  if (p_.usage_limit >= 0 && (!has_usages_ || !has_intervals_)) return std::nullopt;
  if (has_usages_ && !rows_fit(usages_, false)) return std::nullopt;
  if (has_intervals_ && intervals_.size() != n) return std::nullopt;
  if (has_names_ && p_.node_names.size() != n) return std::nullopt;
  if (enodes_.size() != ecosts_.size()) return std::nullopt;
  for (size_t e = 0; e < enodes_.size(); ++e) {
    const auto [u, v] = enodes_[e];
    if (u < 0 || v < 0 || static_cast<size_t>(u) >= n || static_cast<size_t>(v) >= n) return std::nullopt;
    if (ecosts_[e].size() != p_.node_costs[u].size() * p_.node_costs[v].size()) return std::nullopt;
  }
  for (const Budget& b : budgets_)
    if (!b.has_usages || !rows_fit(b.g.usage, true) || b.g.low > b.g.high) return std::nullopt;

  if (has_usages_)
    p_.node_usages = std::move(usages_);
  else
    p_.node_usages.assign(n, {});
  if (has_intervals_)
    p_.intervals = std::move(intervals_);
  else
    p_.intervals.assign(n, Interval{});
  p_.edges.resize(enodes_.size());
  for (size_t e = 0; e < enodes_.size(); ++e) {
    p_.edges[e].u = static_cast<int32_t>(enodes_[e].first);
    p_.edges[e].v = static_cast<int32_t>(enodes_[e].second);
    p_.edges[e].costs = std::move(ecosts_[e]);
  }
  for (Budget& b : budgets_) p_.budgets.push_back(std::move(b.g));
  return std::move(p_);
}

// A problem the event reader accepts from `input` (text or stream), or nothing.
std::optional<Problem> read_events(detail::JsonInput&& input) {
  ProblemEvents events(input);
  if (!detail::json_events(input, events)) return std::nullopt;
  return events.finish();
}

// What the event reader gave up on (a fault, or what it leaves to the tree reader, such as a
// repeated key): the tree reader finds the first fault in its order and words it.
Problem read_tree(std::string_view text, const std::string& source) {
  Json doc;
  try {
    doc = parse_json(text);
  } catch (const JsonError& e) {
    fail(source, e.what());
  }
  return problem_from_json(doc, source);
}
}  // namespace

std::optional<Problem> read_problem_events(std::string_view text) { return read_events(detail::JsonInput(text)); }

Problem parse_problem(std::string_view text, const std::string& source) {
  if (std::optional<Problem> p = read_problem_events(text)) {
    validate_problem(*p, source);
    return std::move(*p);
  }
  return read_tree(text, source);
}

// The event reader parses the file as it is read (and inflated, on another thread); only a
// file it gives up on is read whole, for the tree reader.
Problem read_problem(const std::string& path) {
  std::optional<Problem> p;
  try {
    const std::unique_ptr<std::istream> in = open_text_stream(path);
    p = read_events(detail::JsonInput(*in->rdbuf()));
  } catch (const std::runtime_error& e) {
    throw ProblemError(e.what());
  }
  if (p) {
    validate_problem(*p, path);
    return std::move(*p);
  }
  std::string text;
  try {
    text = read_file_maybe_gzip(path);
  } catch (const std::exception& e) {
    throw ProblemError(e.what());
  }
  return read_tree(text, path);
}

namespace {
// Integral costs (IOPDDL's, and the 1e18 infeasible marker) as integers, the rest shortest.
Json cost_json(Cost c) {
  if (std::nearbyint(c) == c && std::fabs(c) < 9.2e18) return Json(static_cast<int64_t>(c));
  return json_number(c);
}
Json usage_row(const std::vector<int64_t>& row, size_t strategies) {
  Json a = Json::array();
  for (size_t s = 0; s < strategies; ++s) a.push_back(Json(row.empty() ? 0 : row[s]));
  return a;
}
}  // namespace

Json problem_to_json(const Problem& p) {
  const size_t n = p.num_nodes();
  Json nodes = Json::object();
  Json costs = Json::array(), usages = Json::array(), intervals = Json::array();
  for (size_t i = 0; i < n; ++i) {
    Json row = Json::array();
    for (Cost c : p.node_costs[i]) row.push_back(cost_json(c));
    costs.push_back(std::move(row));
    usages.push_back(
        usage_row(i < p.node_usages.size() ? p.node_usages[i] : std::vector<int64_t>{}, p.num_strategies(i)));
    Interval iv = i < p.intervals.size() ? p.intervals[i] : Interval{};
    intervals.push_back(Json::array({Json(iv.start), Json(iv.end)}));
  }
  nodes["costs"] = std::move(costs);
  nodes["usages"] = std::move(usages);
  nodes["intervals"] = std::move(intervals);
  if (!p.node_names.empty()) {
    Json names = Json::array();
    for (const auto& s : p.node_names) names.push_back(Json(s));
    nodes["names"] = std::move(names);
  }
  Json edges = Json::object();
  Json enodes = Json::array(), ecosts = Json::array();
  for (const Edge& e : p.edges) {
    enodes.push_back(Json::array({Json(e.u), Json(e.v)}));
    Json m = Json::array();
    for (Cost c : e.costs) m.push_back(cost_json(c));
    ecosts.push_back(std::move(m));
  }
  edges["nodes"] = std::move(enodes);
  edges["costs"] = std::move(ecosts);
  Json pr = Json::object();
  if (!p.name.empty()) pr["name"] = p.name;
  pr["nodes"] = std::move(nodes);
  pr["edges"] = std::move(edges);
  if (p.usage_limit >= 0) pr["usage_limit"] = p.usage_limit;
  if (!p.budgets.empty()) {
    Json list = Json::array();
    for (const GlobalBudget& g : p.budgets) {
      Json b = Json::object();
      b["name"] = g.name;
      Json rows = Json::array();
      for (size_t i = 0; i < n; ++i)
        rows.push_back(usage_row(i < g.usage.size() ? g.usage[i] : std::vector<int64_t>{}, p.num_strategies(i)));
      b["usages"] = std::move(rows);
      b["low"] = g.low;
      b["high"] = g.high;
      list.push_back(std::move(b));
    }
    pr["budgets"] = std::move(list);
  }
  Json doc = Json::object();
  doc["problem"] = std::move(pr);
  return doc;
}

static void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw ProblemError("cannot write '" + path + "': check that the directory exists and is writable");
  out << text << "\n";
  if (!out) throw ProblemError("error while writing '" + path + "'");
}

void write_problem(const Problem& p, const std::string& path) { write_text(path, dump_json(problem_to_json(p))); }

Json solution_to_json(const Solution& s) {
  Json a = Json::array();
  for (int32_t x : s) a.push_back(Json(x));
  Json doc = Json::object();
  doc["solution"] = std::move(a);
  return doc;
}

void write_solution(const Solution& s, const std::string& path) { write_text(path, dump_json(solution_to_json(s))); }

Solution read_solution(const std::string& path, const Problem& p) {
  Json doc;
  try {
    doc = parse_json(read_file_maybe_gzip(path));
  } catch (const std::exception& e) {
    fail(path, e.what());
  }
  const auto& arr = array_of(require(doc, "solution", "top level", path), "solution", path);
  if (arr.size() != p.num_nodes())
    fail(path, "solution: has " + std::to_string(arr.size()) + " entries but the problem has " +
                   std::to_string(p.num_nodes()) + " nodes");
  Solution s(arr.size());
  for (size_t i = 0; i < arr.size(); ++i) {
    int64_t v = read_int(arr[i], idx("solution", i), path);
    if (v < 0 || static_cast<size_t>(v) >= p.num_strategies(i))
      fail(path, idx("solution", i) + ": strategy " + std::to_string(v) + " out of range (node " + std::to_string(i) +
                     " has " + std::to_string(p.num_strategies(i)) + " strategies)");
    s[i] = static_cast<int32_t>(v);
  }
  return s;
}

}  // namespace autoshard
