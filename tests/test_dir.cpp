#include <catch2/catch.hpp>
TEST_CASE("dir placeholder") { REQUIRE(true); }
