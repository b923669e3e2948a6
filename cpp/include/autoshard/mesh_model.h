// MeshModel (cpp/src/cost/mesh_model.cpp): a mesh with the cost context of its dims.
#pragma once

#include <string_view>
#include <vector>

#include "autoshard/cost_model.h"
#include "autoshard/placement.h"

namespace autoshard {

// The mesh together with what costs need: the hardware profile and each mesh dim's link.
struct MeshModel {
  Mesh mesh;
  HardwareProfile hw;
  std::vector<MeshDimLink> links;  // one per mesh dim
  // Validates the mesh (positive sizes, names unique and one per dim or none).
  static MeshModel make(const Mesh& mesh, const HardwareProfile& hardware);
  // The same with a built-in profile's name ("H100").
  static MeshModel make(const Mesh& mesh, std::string_view profile_name);
};

}  // namespace autoshard
