// A layout from placement strings, for tests: L({"S(0)", "R"}).
#pragma once

#include <initializer_list>

#include "autoshard/placement.h"

inline autoshard::Layout L(std::initializer_list<const char*> ps) {
  autoshard::Layout l;
  for (const char* p : ps) l.push_back(autoshard::Placement::parse(p));
  return l;
}
