# Helpers shared by the layer and test CMakeLists.

# megamoe_add_layer(<layer> [DEPS <layer>...] [LIBS <lib>...])
# Builds src/<layer>/*.c into an object library megamoe_<layer>_obj and a static library
# megamoe_<layer> (linking the layers below it), and records the layer for libmegamoe.so.
function(megamoe_add_layer layer)
  cmake_parse_arguments(ARG "" "" "DEPS;LIBS" ${ARGN})
  file(GLOB sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/*.c)
  if(NOT sources)
    return()
  endif()
  add_library(megamoe_${layer}_obj OBJECT ${sources})
  # Hidden by default: libmegamoe.so exports only the public API (include/megamoe/export.h).
  set_target_properties(megamoe_${layer}_obj PROPERTIES C_VISIBILITY_PRESET hidden)
  target_include_directories(megamoe_${layer}_obj PUBLIC ${PROJECT_SOURCE_DIR}/include
                             PRIVATE ${PROJECT_SOURCE_DIR}/src)
  foreach(dep ${ARG_LIBS})
    target_link_libraries(megamoe_${layer}_obj PUBLIC ${dep})
  endforeach()
  add_library(megamoe_${layer} STATIC $<TARGET_OBJECTS:megamoe_${layer}_obj>)
  target_include_directories(megamoe_${layer} PUBLIC ${PROJECT_SOURCE_DIR}/include
                             ${PROJECT_SOURCE_DIR}/src)
  foreach(dep ${ARG_DEPS})
    if(TARGET megamoe_${dep})
      target_link_libraries(megamoe_${layer} PUBLIC megamoe_${dep})
    endif()
  endforeach()
  target_link_libraries(megamoe_${layer} PUBLIC ${ARG_LIBS} Threads::Threads m)
  set_property(GLOBAL APPEND PROPERTY MEGAMOE_LAYERS ${layer})
  set_property(GLOBAL APPEND PROPERTY MEGAMOE_LAYER_LIBS ${ARG_LIBS})
endfunction()

# megamoe_add_test(<name> SOURCES <src>... [LIBS <target>...] [RANKS n] [HOSTS h] [TIMEOUT s]
#                  [LABELS l...] [ARGS a...] [ENV VAR=value...])
# One CTest executable; with RANKS it runs under `megamoe launch -n RANKS` (with HOSTS on h
# simulated hosts: `megamoe launch --hosts h`, which needs root).
function(megamoe_add_test name)
  cmake_parse_arguments(ARG "" "RANKS;HOSTS;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS;ENV" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE megamoe_test_harness ${ARG_LIBS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests ${PROJECT_SOURCE_DIR}/src)
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  if(ARG_RANKS AND ARG_HOSTS)
    add_test(NAME ${name}
             COMMAND $<TARGET_FILE:megamoe_cli> launch --hosts ${ARG_HOSTS} -n ${ARG_RANKS}
                     --timeout ${ARG_TIMEOUT} -- $<TARGET_FILE:${name}> ${ARG_ARGS})
  elseif(ARG_RANKS)
    add_test(NAME ${name}
             COMMAND $<TARGET_FILE:megamoe_cli> launch -n ${ARG_RANKS} --timeout ${ARG_TIMEOUT}
                     -- $<TARGET_FILE:${name}> ${ARG_ARGS})
  else()
    add_test(NAME ${name} COMMAND ${name} ${ARG_ARGS})
  endif()
  math(EXPR ctest_timeout "${ARG_TIMEOUT} + 30")
  # exit 77: every case the harness ran was skipped (tests/harness/harness.h)
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ctest_timeout} LABELS "${ARG_LABELS}"
                       SKIP_RETURN_CODE 77)
  if(ARG_ENV)
    set_tests_properties(${name} PROPERTIES ENVIRONMENT "${ARG_ENV}")
  endif()
endfunction()
