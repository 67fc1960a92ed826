#include "dir/dir.hpp"
