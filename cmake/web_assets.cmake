# The chat page's files, embedded into rill_server at build time
# (server/web/assets.h): the page itself from src/server/web/, and the
# JavaScript libraries it renders markdown with from their Debian packages
# (installed by scripts/setup.sh; never copied into the repository).
function(rill_find_web_file var package)
  find_file(${var} NAMES ${ARGN} PATHS /usr/share/javascript /usr/share/nodejs NO_DEFAULT_PATH)
  if(NOT ${var} OR NOT EXISTS "${${var}}")
    message(FATAL_ERROR "The chat page needs ${ARGN} from the Debian package ${package}: "
                        "run scripts/setup.sh (or apt-get install ${package}), or set -D${var}=<path>.")
  endif()
endfunction()

function(rill_embed_web_assets target)
  rill_find_web_file(RILL_MARKED_JS libjs-marked marked/marked.umd.min.js marked/marked.min.js)
  rill_find_web_file(RILL_HIGHLIGHT_JS libjs-highlight.js highlight.js/highlight.min.js)
  rill_find_web_file(RILL_HIGHLIGHT_CSS libjs-highlight.js highlight.js/styles/github.css)
  rill_find_web_file(RILL_PURIFY_JS node-dompurify dompurify/dist/purify.min.js)
  set(web ${CMAKE_SOURCE_DIR}/src/server/web)
  set(js "text/javascript")
  set(css "text/css")
  set(entries
      "index.html|text/html|${web}/chat.html"
      "chat.js|${js}|${web}/chat.js"
      "chat.css|${css}|${web}/chat.css"
      "marked.js|${js}|${RILL_MARKED_JS}"
      "highlight.js|${js}|${RILL_HIGHLIGHT_JS}"
      "highlight.css|${css}|${RILL_HIGHLIGHT_CSS}"
      "purify.js|${js}|${RILL_PURIFY_JS}")
  set(manifest ${CMAKE_BINARY_DIR}/web_assets.manifest)
  set(out ${CMAKE_BINARY_DIR}/generated/web_assets.cpp)
  list(JOIN entries "\n" text)
  file(CONFIGURE OUTPUT ${manifest} CONTENT "${text}\n")
  set(paths "")
  foreach(e IN LISTS entries)
    string(REGEX REPLACE "^.*\\|" "" p "${e}")
    list(APPEND paths ${p})
  endforeach()
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DMANIFEST=${manifest} -DOUT=${out} -P ${CMAKE_SOURCE_DIR}/cmake/embed_files.cmake
    DEPENDS ${paths} ${manifest} ${CMAKE_SOURCE_DIR}/cmake/embed_files.cmake
    COMMENT "Embedding the chat page and its JavaScript libraries"
    VERBATIM)
  target_sources(${target} PRIVATE ${out})
endfunction()
