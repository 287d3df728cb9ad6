# kiln_embed_files(<out.cc> <namespace-qualified table name> <files...>)
# Generates a C++ source holding each file's bytes, so the binary needs no data files at
# run time (the training corpus, kernel templates). The table is
#   const kiln::EmbeddedFile NAME[]; const size_t NAME_count;
# with EmbeddedFile {const char* path; const unsigned char* data; size_t size;} from
# ir/embedded_file.h; `path` is relative to the source root.
function(kiln_embed_files out_cc table)
  set(files ${ARGN})
  add_custom_command(
    OUTPUT ${out_cc}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out_cc} -DTABLE=${table} -DROOT=${CMAKE_SOURCE_DIR}
            "-DFILES=${files}" -P ${CMAKE_SOURCE_DIR}/cmake/EmbedFilesScript.cmake
    DEPENDS ${files} ${CMAKE_SOURCE_DIR}/cmake/EmbedFilesScript.cmake
    COMMENT "Embedding ${table}"
    VERBATIM)  # keeps the ';'-separated FILES list one argument, not shell command separators
endfunction()
