// One random operation, valid on the tree before the step: the building block
// of the seeded sequences of the crash suite. The choice depends only on the
// step's random generator and that tree, so a seed replays the same sequence.
#pragma once

#include "crash_harness.hpp"

namespace nvfs::test {

void RandomOp(StepContext& c);

}  // namespace nvfs::test
