// The IOPDDL problem and solution documents (format in autoshard/problem_io.h), for callers
// that hold a parsed document rather than a file.
#pragma once

#include <string>

#include "autoshard/problem.h"
#include "io/json.h"

namespace autoshard {

// Converts a parsed document; throws ProblemError naming `source` and the field.
Problem problem_from_json(const Json& doc, const std::string& source = "<json>");
// The IOPDDL document of a problem (extensions written only when used).
Json problem_to_json(const Problem& problem);
Json solution_to_json(const Solution& solution);

}  // namespace autoshard
