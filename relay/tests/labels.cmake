# The labels of the relay's tests, read by ctest after the lists of tests
# gtest_discover_tests found (relay/tests/CMakeLists.txt): each test of a
# list gets every label of its line. All are "relay"; the unit tests,
# which need no server, are also "fast" (make check-fast). The SQL
# engine's integration tests keep their one label integration_sql-engine
# beside "sql-engine": ctest -L integration selects them with the C
# engine's, as -L takes a regular expression. A list is missing while
# its program is not built yet (ctest then runs its NOT_BUILT test).
foreach(_labelled
    "relay_unit_tests_TESTS|unit;relay;fast"
    "relay_integration_tests_TESTS|integration;relay"
    "relay_integration_tests_sql_TESTS|integration_sql-engine;sql-engine;relay"
    "relay_cluster_tests_TESTS|cluster;relay")
  string(REPLACE "|" ";" _pair "${_labelled}")
  list(POP_FRONT _pair _list)
  if(DEFINED ${_list} AND NOT "${${_list}}" STREQUAL "")
    set_tests_properties(${${_list}} PROPERTIES LABELS "${_pair}")
  endif()
endforeach()
