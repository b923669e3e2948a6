// The mesh plus the cost context of its dims (hardware profile and per-dim links).
#include <set>
#include <stdexcept>

#include "autoshard/mesh_model.h"

namespace autoshard {

MeshModel MeshModel::make(const Mesh& mesh, const HardwareProfile& hardware) {
  if (mesh.shape.empty()) throw std::invalid_argument("mesh: the shape is empty (give at least one dim, e.g. [8])");
  if (mesh.shape.size() > 8) throw std::invalid_argument("mesh: more than 8 dims are not supported");
  for (size_t i = 0; i < mesh.shape.size(); ++i)
    if (mesh.shape[i] < 1)
      throw std::invalid_argument("mesh: dim " + std::to_string(i) + " has size " + std::to_string(mesh.shape[i]) +
                                  " (sizes must be >= 1)");
  if (!mesh.dim_names.empty()) {
    if (mesh.dim_names.size() != mesh.shape.size())
      throw std::invalid_argument("mesh: " + std::to_string(mesh.dim_names.size()) + " dim names for " +
                                  std::to_string(mesh.shape.size()) + " dims");
    std::set<std::string> seen(mesh.dim_names.begin(), mesh.dim_names.end());
    if (seen.size() != mesh.dim_names.size()) throw std::invalid_argument("mesh: dim names must be unique");
  }
  MeshModel m;
  m.mesh = mesh;
  if (m.mesh.dim_names.empty())
    for (size_t i = 0; i < mesh.shape.size(); ++i) m.mesh.dim_names.push_back("dim" + std::to_string(i));
  m.hw = hardware;
  m.links = mesh_dim_links(m.hw, mesh.shape);
  if (m.links.size() != mesh.shape.size())
    throw std::logic_error("mesh_dim_links returned " + std::to_string(m.links.size()) + " links for " +
                           std::to_string(mesh.shape.size()) + " mesh dims");
  return m;
}

MeshModel MeshModel::make(const Mesh& mesh, std::string_view profile_name) {
  return make(mesh, hardware_profile(profile_name));
}

}  // namespace autoshard
