// Reading and writing solver problems and solutions (IOPDDL files, optionally gzip; the
// format code is in cpp/src/io/problem_json.cpp).
//
// File shape (shared/bench/iopddl/README.md), with autoshard's optional extensions marked (+):
//   {"problem": {
//      "name": "...",
//      "nodes": {"costs": [[...]], "usages": [[...]], "intervals": [[start, end]],
//                "names"(+): ["..."]},
//      "edges": {"nodes": [[u, v]], "costs": [[... |S_u| x |S_v| row-major ...]]},
//      "usage_limit": N,                         (absent: no memory limit)
//      "budgets"(+): [{"name": "...", "usages": [[...]], "low": L, "high": H}]}}
// "usages" and "intervals" may be absent only when there is no "usage_limit" (then every
// usage is 0). Every reader error is a ProblemError whose message names the file, the field
// (e.g. "problem.edges.costs[3]") and what to do.
#pragma once

#include <string>
#include <string_view>

#include "autoshard/problem.h"

namespace autoshard {

// Reads PATH (plain or gzip JSON) and validates it (validate_problem, problem.h). Throws
// ProblemError.
Problem read_problem(const std::string& path);
// Parses the text of a file; `source` names the input in messages (a path or "<string>").
Problem parse_problem(std::string_view text, const std::string& source = "<string>");

// Writes the IOPDDL file of a problem (extensions written only when used).
void write_problem(const Problem& problem, const std::string& path);

// Solutions: {"solution": [s0, s1, ...]}.
void write_solution(const Solution& solution, const std::string& path);
// Reads a solution file and checks it against the problem (length, strategy ranges).
Solution read_solution(const std::string& path, const Problem& problem);

}  // namespace autoshard
