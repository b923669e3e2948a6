// Layouts to and from their JSON form (a list of placement strings).
#include "io/layout_json.h"

#include <stdexcept>

namespace autoshard {

Layout parse_layout(const Json& j, const Mesh& mesh, const std::string& where) {
  if (!j.is_array()) throw JsonError(where + ": expected a layout like [\"S(0)\", \"R\"] (one placement per mesh dim)");
  const auto& items = json_array(j);
  if (static_cast<int>(items.size()) != mesh.ndim())
    throw JsonError(where + ": layout has " + std::to_string(items.size()) + " placements but the mesh has " +
                    std::to_string(mesh.ndim()) + " dims");
  Layout l;
  for (size_t i = 0; i < items.size(); ++i) {
    try {
      l.push_back(Placement::parse(json_string(items[i], where)));
    } catch (const std::invalid_argument& e) {
      throw JsonError(where + "[" + std::to_string(i) + "]: " + e.what());
    }
  }
  return l;
}

Json layout_to_json(const Layout& l) {
  Json a = Json::array();
  for (const auto& p : l) a.push_back(p.str());
  return a;
}

}  // namespace autoshard
