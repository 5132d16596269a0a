# Writes a header defining NAME as "<first 16 hex digits of SHA-256 over
# SALT and the contents of SOURCES>", so a module's build id changes with
# its code, its headers and its compiler settings, and stays the same for
# an identical rebuild. Run as: cmake -DOUT=... -DNAME=... -DSALT=...
# -DSOURCES=a|b|c -P build_id.cmake
string(REPLACE "|" ";" files "${SOURCES}")
set(text "${SALT}")
foreach(f IN LISTS files)
  file(READ "${f}" content)
  string(APPEND text "\n--${f}--\n${content}")
endforeach()
string(SHA256 hash "${text}")
string(SUBSTRING "${hash}" 0 16 hash)
file(WRITE "${OUT}.tmp" "#define ${NAME} \"${hash}\"\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
