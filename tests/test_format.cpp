#include <catch2/catch.hpp>
TEST_CASE("placeholder format") { REQUIRE(true); }
