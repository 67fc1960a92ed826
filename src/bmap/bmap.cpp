#include "bmap/bmap.hpp"
