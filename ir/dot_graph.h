// Graphviz output. Nodes are grouped into clusters by scope ("layers.3.attn" sits inside
// "layers.3"), so a 16-layer model reads as 16 boxes; edges carry tensor types.
#pragma once

#include <string>

#include "ir/graph.h"

namespace kiln {

struct DotOptions {
  // Leave out constants and iotas feeding a single user (they clutter large graphs).
  bool hide_small_constants = true;
};

std::string ModuleToDot(const Module& module, const DotOptions& options = {});

}  // namespace kiln
