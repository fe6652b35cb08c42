# embed.cmake - write a C source holding a file's bytes as a NUL-terminated
# array, so the binary carries it (the stats port's page, the queue guards'
# Lua script), and its SHA-1 in hex as <NAME>_sha1 (what EVALSHA names).
#   cmake -DINPUT=<file> -DOUTPUT=<file.c> -DNAME=<symbol> -P embed.cmake
file(READ "${INPUT}" hex HEX)
file(SHA1 "${INPUT}" sha1)
string(LENGTH "${hex}" hexlen)
math(EXPR size "${hexlen} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
     "/* generated from ${INPUT} by scripts/embed.cmake: do not edit */\n"
     "#include <stddef.h>\n"
     "const char ${NAME}[] = {\n${bytes}0x00};\n"
     "const size_t ${NAME}_len = ${size};\n"
     "const char ${NAME}_sha1[] = \"${sha1}\";\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
