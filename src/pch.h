// Precompiled header: the heavy libtorch headers, parsed once per target.
#pragma once
#include <torch/torch.h>
