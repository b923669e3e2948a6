// A layout's file form, one placement string per mesh dim: ["S(0)", "R"] (docs/formats.md
// section 2), as options, plans and strategy listings write it.
#pragma once

#include <string>

#include "autoshard/placement.h"
#include "io/json.h"

namespace autoshard {

// `where` names the value in errors (JsonError): not an array, a count that is not the mesh's
// number of dims, a placement that does not parse.
Layout parse_layout(const Json& j, const Mesh& mesh, const std::string& where);
Json layout_to_json(const Layout& l);

}  // namespace autoshard
