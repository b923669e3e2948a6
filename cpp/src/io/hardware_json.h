// Hardware profiles to and from JSON, so a planner option or a user can describe hardware
// that is not built in (or override a built-in profile's network, node size, efficiencies).
#pragma once

#include <string_view>

#include "autoshard/cost_model.h"
#include "io/json.h"

namespace autoshard {

// A profile from JSON: either a known name ("H100") or an object of HardwareProfile fields,
// optionally starting from a known profile: {"base": "H100", "gpus_per_node": 4,
// "inter_node_bandwidth": 25e9}. Unknown keys and wrong types throw std::invalid_argument
// naming the key; the result is validated (validate_hardware_profile).
HardwareProfile hardware_profile_from_json(const Json& spec);
// A profile named ("H100") or written as a JSON object's text ('{"base": "CPU", ...}'): how
// the command line and bindings carry hardware that is not built in (e.g. one measured at
// run time).
HardwareProfile hardware_profile_from_text(std::string_view text);
// Every field as a JSON object (the inverse of hardware_profile_from_json).
Json hardware_profile_to_json(const HardwareProfile& hw);

}  // namespace autoshard
