// The IOPDDL problem and solution documents (format in autoshard/problem_io.h), for callers
// that hold a parsed document rather than a file.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "autoshard/problem.h"
#include "io/json.h"

namespace autoshard {

// Converts a parsed document; throws ProblemError naming `source` and the field.
Problem problem_from_json(const Json& doc, const std::string& source = "<json>");
// The IOPDDL document of a problem (extensions written only when used).
Json problem_to_json(const Problem& problem);
Json solution_to_json(const Solution& solution);

// The event reader alone (parse_problem's fast path): the problem, unchecked by
// validate_problem, or nothing where it leaves the text to the document reader. For tests
// that the event reader takes what it should, rather than passing it on.
std::optional<Problem> read_problem_events(std::string_view text);

}  // namespace autoshard
