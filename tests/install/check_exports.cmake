# cmake -DLIB=<libmegamoe.so> -DHEADERS=<include/megamoe> -DNM=<nm> -P check_exports.cmake
# The shared library's dynamic symbol table must hold exactly the functions the public headers
# declare (megamoe_*), plus the few symbols the toolchain itself may add: no internal mm_*
# symbol (hidden visibility), and no public function missing (a declaration outside the
# MEGAMOE_API_BEGIN/END block of its header, or a definition that does not see its header).
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND ${NM} -D --defined-only ${LIB} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D ${LIB} failed")
endif()
set(toolchain_symbols _init _fini _edata _end __bss_start)
string(REPLACE "\n" ";" lines "${out}")
set(exported "")
set(unexpected "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] ([^ @]+)")
    set(sym ${CMAKE_MATCH_1})
    if(sym MATCHES "^megamoe_")
      list(APPEND exported ${sym})
    elseif(NOT sym IN_LIST toolchain_symbols)
      list(APPEND unexpected ${sym})
    endif()
  endif()
endforeach()

file(GLOB headers ${HEADERS}/*.h)
set(declared "")
foreach(header IN LISTS headers)
  file(STRINGS ${header} decls REGEX "^[a-z].*[ *]megamoe_[a-z0-9_]+\\(")
  foreach(decl IN LISTS decls)
    # static inline helpers (the extensible structs' *_default()) are the caller's code
    if(NOT decl MATCHES "^typedef" AND NOT decl MATCHES "^static" AND
       decl MATCHES "[ *](megamoe_[a-z0-9_]+)\\(")
      list(APPEND declared ${CMAKE_MATCH_1})
    endif()
  endforeach()
endforeach()

set(missing ${declared})
list(REMOVE_ITEM missing ${exported})
set(undeclared ${exported})
list(REMOVE_ITEM undeclared ${declared})
list(LENGTH exported n_exported)
list(LENGTH declared n_declared)
list(LENGTH unexpected n_unexpected)
message(STATUS "${LIB}: ${n_exported} megamoe_* exported, ${n_declared} declared in ${HEADERS}")
if(unexpected)
  list(SUBLIST unexpected 0 20 shown)
  message(FATAL_ERROR "${n_unexpected} exported symbols outside the public API (first: ${shown}); "
                      "internal code must stay hidden (C_VISIBILITY_PRESET hidden)")
endif()
if(missing)
  message(FATAL_ERROR "declared in the public headers but not exported: ${missing}; declare "
                      "them between MEGAMOE_API_BEGIN and MEGAMOE_API_END (megamoe/export.h)")
endif()
if(undeclared)
  message(FATAL_ERROR "exported but declared in no public header: ${undeclared}")
endif()
