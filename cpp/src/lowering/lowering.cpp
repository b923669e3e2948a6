// Lowering the sharding model to the solver problem (problem.h).
#include <fmt/format.h>

#include "autoshard/lowering.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "autoshard/layout.h"
#include "autoshard/overlap_model.h"
#include "autoshard/memory_model.h"

namespace autoshard {

namespace {

Cost clamp_cost(double c) { return c < kInfeasibleCost ? c : kInfeasibleCost; }

class Lowerer {
 public:
  Lowerer(const ShardingModel& sm, const LoweringOptions& opt, RedistributionCache& cache)
      : sm_(sm), g_(*sm.graph), opt_(opt), cache_(cache), count_(sm.tie_counts()) {}

  LoweredProblem run() {
    const size_t n = g_.nodes.size();
    lp_.overlap = model_overlap(sm_, cache_);
    const bool memlimit = opt_.memory_limit_bytes >= 0;
    const bool budget = opt_.parameter_memory.has_value();
    lp_.solver_node.assign(n, -1);
    // One solver node per node that is not a tied copy; a copy shares its representative's,
    // whose compute is charged once per copy.
    for (size_t i = 0; i < n; ++i) {
      if (count_[i] == 0) continue;
      const Node& node = g_.nodes[i];
      const auto& strategies = sm_.strategies[i];
      bool keep = strategies.size() > 1 || !opt_.fold_single_strategy || memlimit ||
                  (budget && node.role == NodeRole::Parameter);
      if (!keep) {
        lp_.constant_cost += count_[i] * strategies[0].compute_us;
        continue;
      }
      lp_.solver_node[i] = static_cast<int32_t>(lp_.graph_node.size());
      lp_.graph_node.push_back(static_cast<int32_t>(i));
      std::vector<Cost> costs;
      for (const auto& s : strategies) costs.push_back(count_[i] * s.compute_us);
      lp_.problem.node_costs.push_back(std::move(costs));
      lp_.problem.node_names.push_back(node.name);
    }
    for (size_t i = 0; i < n; ++i) lp_.solver_node[i] = lp_.solver_node[sm_.tied.of(static_cast<int32_t>(i))];
    add_data_edges();
    add_output_sinks();
    for (auto& [key, costs] : edges_) {
      Edge e;
      e.u = key.first;
      e.v = key.second;
      e.costs = std::move(costs);
      lp_.problem.edges.push_back(std::move(e));
    }
    add_intervals_and_usage(memlimit);
    if (budget) add_parameter_budget();
    lp_.problem.name = "autoshard plan";
    return std::move(lp_);
  }

 private:
  const ShardingModel& sm_;
  const Graph& g_;
  const LoweringOptions& opt_;
  RedistributionCache& cache_;
  LoweredProblem lp_;
  std::vector<int32_t> count_;  // per graph node: how many nodes take its strategy (tie_counts)
  std::map<std::pair<int32_t, int32_t>, std::vector<Cost>> edges_;

  // One redistribution between two nodes' layouts, as seen from the nodes that take the
  // strategies (tied copies replaced by their representatives): the tensor references and
  // gradients of all copies of a layer that agree on it share one table, added `times` times.
  struct PairKey {
    int32_t u = 0, v = 0;  // representatives
    int32_t u_side = 0;    // which output of u
    int32_t v_side = 0;    // data edge: which input of v; gradient: -1 - (which output of v)
    bool grad = false;
    double exposed = 1, launch_share = 1;
    auto tie() const { return std::tie(u, v, u_side, v_side, grad, exposed, launch_share); }
    bool operator<(const PairKey& o) const { return tie() < o.tie(); }
  };
  struct PairGroup {
    int64_t times = 0;
    const TensorMeta* meta = nullptr;
    std::string what;  // the first reference's description, for errors
  };
  std::map<PairKey, PairGroup> pairs_;

  void note_pair(const PairKey& k, const TensorMeta& meta, const std::function<std::string()>& what) {
    PairGroup& grp = pairs_[k];
    if (grp.times++ == 0) {
      grp.meta = &meta;
      grp.what = what();
    }
  }

  void add_noted_pairs() {
    for (const auto& [k, grp] : pairs_) {
      std::vector<const Layout*> lv;
      if (k.grad) {
        lv = output_layouts(k.v, -1 - k.v_side);
      } else {
        for (const auto& s : sm_.of(k.v)) lv.push_back(&s.inputs[k.v_side]);
      }
      const Node& consumer = g_.nodes[k.v];
      const bool local = !k.grad && std::find(consumer.local_inputs.begin(), consumer.local_inputs.end(), k.v_side) !=
                                        consumer.local_inputs.end();
      add_pair(k.u, k.v, *grp.meta, output_layouts(k.u, k.u_side), lv, !k.grad, grp.what, k.exposed, k.launch_share,
               static_cast<double>(grp.times), local);
    }
  }

  // Adds the cost of moving a tensor between a layout chosen by graph node `gu` (lu[su]) and
  // one chosen by `gv` (lv[sv]); `u_to_v` says which side is the source. `exposed` is the
  // fraction of the time charged (overlap_model.h).
  void add_pair(int32_t gu, int32_t gv, const TensorMeta& meta, const std::vector<const Layout*>& lu,
                const std::vector<const Layout*>& lv, bool u_to_v, const std::string& what, double exposed,
                double launch_share, double times, bool same_layout_only) {
    // Distinct layouts on each side: most strategies share a handful of them.
    auto distinct = [&](const std::vector<const Layout*>& l, std::vector<int>& id, std::vector<int32_t>& reps) {
      std::unordered_map<int32_t, int> seen;
      for (const Layout* x : l) {
        auto [it, fresh] = seen.emplace(cache_.intern(*x), static_cast<int>(reps.size()));
        if (fresh) reps.push_back(it->first);
        id.push_back(it->second);
      }
    };
    if (opt_.limits) opt_.limits->check_time("building the cost table of " + what);
    std::vector<int> iu, iv;
    std::vector<int32_t> ru, rv;
    distinct(lu, iu, ru);
    distinct(lv, iv, rv);
    std::vector<double> table(ru.size() * rv.size());
    const int32_t meta_id = cache_.intern(meta);
    for (size_t a = 0; a < ru.size(); ++a) {
      if (opt_.limits && a % 64 == 63) opt_.limits->check_time("building the cost table of " + what);
      for (size_t b = 0; b < rv.size(); ++b) {
        const int32_t from = u_to_v ? ru[a] : rv[b], to = u_to_v ? rv[b] : ru[a];
        // the call count only matters where a launch is shared (most edges pay it in full)
        const int calls = launch_share < 1 ? cache_.collectives(meta_id, from, to) : 0;
        table[a * rv.size() + b] =
            same_layout_only && ru[a] != rv[b]
                ? kInfeasibleCost
                : clamp_cost(times * charged_time_us(cache_.time_us(meta_id, from, to), calls, lp_.overlap.launch_us,
                                                     launch_share, exposed));
      }
    }
    auto cost = [&](size_t su, size_t sv) { return table[iu[su] * rv.size() + iv[sv]]; };

    const int32_t u = lp_.solver_node[gu], v = lp_.solver_node[gv];
    auto& pc = lp_.problem.node_costs;
    if (u >= 0 && u == v) {  // one node (or two tied ones): the same strategy on both sides
      for (size_t s = 0; s < lu.size(); ++s) pc[u][s] = clamp_cost(pc[u][s] + cost(s, s));
    } else if (u < 0 && v < 0) {
      add_constant(cost(0, 0), what);
    } else if (u < 0) {
      for (size_t sv = 0; sv < lv.size(); ++sv) pc[v][sv] = clamp_cost(pc[v][sv] + cost(0, sv));
    } else if (v < 0) {
      for (size_t su = 0; su < lu.size(); ++su) pc[u][su] = clamp_cost(pc[u][su] + cost(su, 0));
    } else {
      bool ordered = u < v;
      auto key = ordered ? std::make_pair(u, v) : std::make_pair(v, u);
      auto& m = edges_[key];
      size_t nu = lu.size(), nv = lv.size();
      if (m.empty()) m.assign(nu * nv, 0.0);
      for (size_t su = 0; su < nu; ++su)
        for (size_t sv = 0; sv < nv; ++sv) {
          Cost& c = ordered ? m[su * nv + sv] : m[sv * nu + su];
          c = clamp_cost(c + cost(su, sv));
        }
    }
  }

  void add_constant(double c, const std::string& what) {
    if (!(c < kInfeasibleCost))
      throw InfeasibleLayoutsError("no feasible plan: " + what +
                                   " needs a redistribution that is impossible (e.g. Shard -> Partial); relax the "
                                   "constraints on these nodes");
    lp_.constant_cost += c;
  }

  std::vector<const Layout*> output_layouts(int32_t node, int32_t k) {
    std::vector<const Layout*> v;
    for (const auto& s : sm_.of(node)) v.push_back(&*s.outputs[k]);
    return v;
  }

  void add_data_edges() {
    for (size_t c = 0; c < g_.nodes.size(); ++c) {
      const Node& node = g_.nodes[c];
      std::vector<TensorRef> refs = node.tensor_inputs();
      for (size_t a = 0; a < refs.size(); ++a) {
        const TensorRef& r = refs[a];
        PairKey k{sm_.tied.of(r.node),
                  sm_.tied.of(static_cast<int32_t>(c)),
                  r.output,
                  static_cast<int32_t>(a),
                  false,
                  lp_.overlap.input_factor[c][a],
                  lp_.overlap.input_launch_share[c][a]};
        note_pair(k, g_.meta(r), [&] { return "the edge " + g_.nodes[r.node].name + " -> " + node.name; });
      }
    }
  }

  void add_output_sinks() {
    for (size_t j = 0; j < g_.outputs.size(); ++j) {
      const GraphOutput& o = g_.outputs[j];
      const TensorMeta& meta = g_.meta(o.ref);
      if (o.role == GraphOutput::Role::Output) {
        // The output is redistributed to its required layout after the graph runs: a cost on
        // the producer's choice alone.
        const Layout& target = sm_.output_targets[j];
        const int32_t p = o.ref.node;
        auto outs = output_layouts(p, o.ref.output);
        const int32_t u = lp_.solver_node[p];  // a tied copy's output is charged on its representative
        std::string what = "forward output " + std::to_string(o.output_index) + " (" + g_.nodes[p].name + ")";
        auto charged = [&](const Layout& from) {
          return charged_time_us(cache_.time_us(meta, from, target), cache_.collectives(meta, from, target),
                                 lp_.overlap.launch_us, lp_.overlap.output_launch_share[j],
                                 lp_.overlap.output_factor[j]);
        };
        if (u < 0) {
          add_constant(charged(*outs[0]), what);
        } else {
          auto& pc = lp_.problem.node_costs[u];
          for (size_t s = 0; s < outs.size(); ++s) pc[s] = clamp_cost(pc[s] + charged(*outs[s]));
        }
      } else {
        // The gradient leaves in its parameter's layout: producer layout -> parameter layout.
        const int32_t q = o.grad_of, p = o.ref.node;
        PairKey k{sm_.tied.of(q),
                  sm_.tied.of(p),
                  0,
                  -1 - o.ref.output,
                  true,
                  lp_.overlap.output_factor[j],
                  lp_.overlap.output_launch_share[j]};
        note_pair(k, meta, [&] { return "the gradient of " + g_.nodes[q].name + " (" + g_.nodes[p].name + ")"; });
      }
    }
    add_noted_pairs();
  }

  int64_t output_bytes(int32_t node, const Strategy& s) {
    const Node& n = g_.nodes[node];
    int64_t b = 0;
    for (size_t k = 0; k < n.outputs.size(); ++k)
      if (n.outputs[k]) b += local_meta(*n.outputs[k], *s.outputs[k], sm_.model->mesh).bytes();
    return b;
  }

  void add_intervals_and_usage(bool memlimit) {
    // A graph node holds all its outputs' bytes over the union of their live intervals
    // (parameters and buffers: the whole step; graph outputs: to its end).
    const auto live = graph_live_intervals(g_);
    auto node_interval = [&](int32_t gi) {
      Interval iv{gi, gi + 1};
      for (const LiveInterval& o : live[gi]) {
        if (o.end <= o.start) continue;  // a None output
        iv.start = std::min(iv.start, o.start);
        iv.end = std::max(iv.end, o.end);
      }
      return iv;
    };
    // A solver node of tied copies holds, over the union of their intervals, the bytes of as
    // many copies as are ever live at once: never less than the copies hold at any time (so a
    // plan within the limit is within it), more only while fewer copies are live (e.g. a
    // layer's transient activations, one layer's worth, charged over the whole forward).
    std::vector<std::vector<Interval>> copies(lp_.graph_node.size());
    for (size_t gi = 0; gi < g_.nodes.size(); ++gi)
      if (lp_.solver_node[gi] >= 0) copies[lp_.solver_node[gi]].push_back(node_interval(static_cast<int32_t>(gi)));
    for (size_t s = 0; s < lp_.graph_node.size(); ++s) {
      const int32_t gi = lp_.graph_node[s];
      Interval iv = copies[s][0];
      std::vector<std::pair<int64_t, int>> events;
      for (const Interval& c : copies[s]) {
        iv.start = std::min(iv.start, c.start);
        iv.end = std::max(iv.end, c.end);
        events.emplace_back(c.start, 1);
        events.emplace_back(c.end, -1);
      }
      std::sort(events.begin(), events.end());  // at equal times an end (-1) comes first
      int live_now = 0, most = 0;
      for (const auto& e : events) most = std::max(most, live_now += e.second);
      lp_.problem.intervals.push_back(iv);
      std::vector<int64_t> usage;
      if (memlimit)  // a view aliases its input's storage: no bytes of its own
        for (const auto& st : sm_.strategies[gi]) usage.push_back(st.aliases_input ? 0 : most * output_bytes(gi, st));
      lp_.problem.node_usages.push_back(std::move(usage));
    }
    lp_.problem.usage_limit = memlimit ? opt_.memory_limit_bytes : -1;
  }

  void add_parameter_budget() {
    auto [low, high] = *opt_.parameter_memory;
    GlobalBudget b;
    b.name = "parameter memory";
    b.usage.resize(lp_.graph_node.size());
    double lo = 0, hi = 0;
    for (size_t gi = 0; gi < g_.nodes.size(); ++gi) {
      if (g_.nodes[gi].role != NodeRole::Parameter) continue;
      const int32_t s = lp_.solver_node[gi];  // a tied copy adds its bytes to its representative's
      auto& row = b.usage[s];
      const auto& strategies = sm_.of(static_cast<int32_t>(gi));
      row.resize(strategies.size(), 0);
      int64_t smallest = INT64_MAX;
      for (size_t k = 0; k < strategies.size(); ++k) {
        const int64_t bytes = output_bytes(static_cast<int32_t>(gi), strategies[k]);
        row[k] += bytes;
        smallest = std::min(smallest, bytes);
      }
      double full = static_cast<double>(g_.nodes[gi].outputs[0]->bytes());
      // Each parameter's share is relaxed to the smallest fraction it can reach (AutoParallel).
      lo += std::max(static_cast<double>(smallest), low * full);
      hi += std::max(static_cast<double>(smallest), high * full);
      if (static_cast<double>(smallest) > high * full) {
        const std::string share = fmt::format("{:.4g}", static_cast<double>(smallest) / std::max(1.0, full));
        lp_.budget_raised_for.push_back(g_.nodes[gi].name + (sm_.pinned[gi] ? " (pinned)" : "") + " at least " + share +
                                        " of itself");
      }
    }
    b.low = static_cast<int64_t>(std::floor(lo));
    b.high = static_cast<int64_t>(std::ceil(hi));
    lp_.budget_index = static_cast<int>(lp_.problem.budgets.size());
    lp_.problem.budgets.push_back(std::move(b));
  }
};

}  // namespace

TableEstimate estimate_cost_tables(const ShardingModel& sm) {
  const Graph& g = *sm.graph;
  TableEstimate est;
  // Tied copies share their representative's tables: each distinct one counts once.
  std::set<std::tuple<int32_t, int32_t, int32_t, int32_t>> seen;
  auto add = [&](int32_t u, int32_t v, int32_t u_side, int32_t v_side) {
    const double su = static_cast<double>(sm.of(u).size()), sv = static_cast<double>(sm.of(v).size());
    est.untied_entries += su * sv;
    if (sm.tied.any() && !seen.emplace(sm.tied.of(u), sm.tied.of(v), u_side, v_side).second) return;
    est.entries += su * sv;
    if (su * sv > est.largest) {
      est.largest = su * sv;
      est.largest_what = "'" + g.nodes[u].name + "' -> '" + g.nodes[v].name + "' (" + std::to_string(int64_t(su)) +
                         " x " + std::to_string(int64_t(sv)) + " strategies)";
    }
  };
  for (size_t c = 0; c < g.nodes.size(); ++c) {
    const std::vector<TensorRef> refs = g.nodes[c].tensor_inputs();
    for (size_t a = 0; a < refs.size(); ++a)
      add(refs[a].node, static_cast<int32_t>(c), refs[a].output, static_cast<int32_t>(a));
  }
  for (const GraphOutput& o : g.outputs)
    if (o.role == GraphOutput::Role::Grad) add(o.grad_of, o.ref.node, 0, -1 - o.ref.output);
  return est;
}

LoweredProblem lower_to_problem(const ShardingModel& sm, const LoweringOptions& options, RedistributionCache& cache) {
  if (options.parameter_memory) {
    auto [low, high] = *options.parameter_memory;
    if (!(low >= 0 && low <= high))
      throw std::invalid_argument("parameter_memory: need 0 <= low <= high, got low=" + std::to_string(low) +
                                  " high=" + std::to_string(high));
  }
  return Lowerer(sm, options, cache).run();
}

std::vector<int32_t> expand_solution(const LoweredProblem& lp, const Solution& solution) {
  if (solution.size() != lp.graph_node.size())
    throw std::invalid_argument("solution has " + std::to_string(solution.size()) + " entries for " +
                                std::to_string(lp.graph_node.size()) + " solver nodes");
  std::vector<int32_t> choice(lp.solver_node.size(), 0);
  for (size_t g = 0; g < lp.solver_node.size(); ++g)
    if (lp.solver_node[g] >= 0) choice[g] = solution[lp.solver_node[g]];
  return choice;
}

InputComm input_comm(const ShardingModel& sm, const std::vector<int32_t>& choice, size_t c, RedistributionCache& cache,
                     const OverlapModel& overlap) {
  const Graph& g = *sm.graph;
  const Strategy& s = sm.of(static_cast<int32_t>(c)).at(choice[c]);
  const std::vector<TensorRef> refs = g.nodes[c].tensor_inputs();
  InputComm r;
  for (size_t a = 0; a < refs.size(); ++a) {
    const Layout& from = *sm.of(refs[a].node).at(choice[refs[a].node]).outputs[refs[a].output];
    const double us = cache.time_us(g.meta(refs[a]), from, s.inputs[a]);
    r.full_us += us;
    r.charged_us += charged_time_us(us, cache.collectives(g.meta(refs[a]), from, s.inputs[a]), overlap.launch_us,
                                    overlap.input_launch_share[c][a], overlap.input_factor[c][a]);
  }
  return r;
}

ChoiceCost evaluate_choice(const ShardingModel& sm, const std::vector<int32_t>& choice, RedistributionCache& cache,
                           const OverlapModel& overlap) {
  const Graph& g = *sm.graph;
  const Mesh& mesh = sm.model->mesh;
  if (choice.size() != g.nodes.size()) throw std::invalid_argument("evaluate_choice: one choice per graph node");
  auto strat = [&](int32_t node) -> const Strategy& { return sm.of(node).at(choice[node]); };
  ChoiceCost r;
  r.node_comm_us.assign(g.nodes.size(), 0.0);
  for (size_t c = 0; c < g.nodes.size(); ++c) {
    const Strategy& s = strat(static_cast<int32_t>(c));
    r.compute_us += s.compute_us;
    const InputComm in = input_comm(sm, choice, c, cache, overlap);
    r.node_comm_us[c] += in.full_us;
    r.exposed_comm_us += in.charged_us;
    if (g.nodes[c].role == NodeRole::Parameter)
      r.parameter_bytes_per_gpu += local_meta(*g.nodes[c].outputs[0], *s.outputs[0], mesh).bytes();
  }
  for (size_t j = 0; j < g.outputs.size(); ++j) {
    const GraphOutput& o = g.outputs[j];
    const Layout& from = *strat(o.ref.node).outputs[o.ref.output];
    Layout to = o.role == GraphOutput::Role::Output ? sm.output_targets[j] : *strat(o.grad_of).outputs[0];
    const double us = cache.time_us(g.meta(o.ref), from, to);
    r.node_comm_us[o.ref.node] += us;
    r.exposed_comm_us += charged_time_us(us, cache.collectives(g.meta(o.ref), from, to), overlap.launch_us,
                                         overlap.output_launch_share[j], overlap.output_factor[j]);
    r.output_layouts.push_back(to);
  }
  for (double c : r.node_comm_us) r.comm_us += c;
  r.total_us = r.compute_us + r.exposed_comm_us;
  return r;
}

}  // namespace autoshard
