# embed.cmake - write a C source holding a file's bytes as a NUL-terminated
# array, so the binary carries it (the stats port's page).
#   cmake -DINPUT=<file> -DOUTPUT=<file.c> -DNAME=<symbol> -P embed.cmake
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hexlen)
math(EXPR size "${hexlen} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
     "/* generated from ${INPUT} by scripts/embed.cmake: do not edit */\n"
     "#include <stddef.h>\n"
     "const char ${NAME}[] = {\n${bytes}0x00};\n"
     "const size_t ${NAME}_len = ${size};\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
