# Copies the part of MathJax 2 that the site uses (TeX input, HTML-CSS
# output with the TeX fonts, the extensions) from a local MathJax, e.g.
# Debian's libjs-mathjax in /usr/share/javascript/mathjax, into the HTML
# directory, so that the formulas render without the network (about 3 MB of
# the package's 54).
#   cmake -DMATHJAX_DIR=/usr/share/javascript/mathjax -DOUT=<html>/mathjax -P copy_mathjax.cmake
if(NOT EXISTS "${MATHJAX_DIR}/MathJax.js")
  message(FATAL_ERROR "tandem docs: no MathJax.js in ${MATHJAX_DIR} "
                      "(apt-get install libjs-mathjax, or set TANDEM_MATHJAX_DIR)")
endif()
file(COPY "${MATHJAX_DIR}/MathJax.js" "${MATHJAX_DIR}/extensions" DESTINATION "${OUT}"
     FOLLOW_SYMLINK_CHAIN)
foreach(dir jax/element jax/input/TeX fonts/HTML-CSS/TeX/woff fonts/HTML-CSS/TeX/otf)
  get_filename_component(parent "${OUT}/${dir}" DIRECTORY)
  file(COPY "${MATHJAX_DIR}/${dir}" DESTINATION "${parent}" FOLLOW_SYMLINK_CHAIN)
endforeach()
# HTML-CSS without the fonts other than TeX (STIX, Asana, Gyre, ...).
file(COPY "${MATHJAX_DIR}/jax/output/HTML-CSS" DESTINATION "${OUT}/jax/output"
     FOLLOW_SYMLINK_CHAIN REGEX "/fonts/[^/]+$" EXCLUDE)
file(COPY "${MATHJAX_DIR}/jax/output/HTML-CSS/fonts/TeX"
     DESTINATION "${OUT}/jax/output/HTML-CSS/fonts" FOLLOW_SYMLINK_CHAIN)
