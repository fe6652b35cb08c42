# install_files.cmake - run by `cmake --install` (and by cpack) at install
# time, when CMAKE_INSTALL_PREFIX is the prefix being installed to:
#  - the systemd unit, with the paths of this installation in its Exec lines
#    (scripts/ferry.service names /usr/local/bin/ferry);
#  - the configuration and the logrotate file, unless the target already
#    has them: an installation never overwrites a configuration someone
#    edited (the Debian package installs into an empty staging tree, and
#    dpkg handles them as conffiles).
# Set by the install(CODE) before it: FERRY_SOURCE_DIR, FERRY_BINARY_DIR,
# FERRY_BINDIR, FERRY_DOCDIR (relative to the prefix or absolute).

foreach(var FERRY_SOURCE_DIR FERRY_BINARY_DIR FERRY_BINDIR FERRY_DOCDIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_files.cmake: ${var} is not set")
  endif()
endforeach()

function(ferry_full out dir)
  if(IS_ABSOLUTE "${dir}")
    set(${out} "${dir}" PARENT_SCOPE)
  else()
    set(${out} "${CMAKE_INSTALL_PREFIX}/${dir}" PARENT_SCOPE)
  endif()
endfunction()
ferry_full(bindir "${FERRY_BINDIR}")
ferry_full(docdir "${FERRY_DOCDIR}")

# The unit: the source's header comment is the manual installation recipe,
# which an installed copy does not need; the rest names this installation.
file(READ "${FERRY_SOURCE_DIR}/scripts/ferry.service" unit)
string(FIND "${unit}" "# Install:\n" at)
if(at GREATER_EQUAL 0)
  string(SUBSTRING "${unit}" ${at} -1 rest)
  string(FIND "${rest}" "\n#\n" end)
endif()
if(at GREATER_EQUAL 0 AND end GREATER 0)
  math(EXPR end "${at} + ${end} + 3")
  string(SUBSTRING "${unit}" 0 ${at} head)
  string(SUBSTRING "${unit}" ${end} -1 tail)
  set(unit "${head}# Installed with ferry: the paths below are those of this installation.\n#\n${tail}")
endif()
string(REPLACE "/usr/local/bin/ferry" "${bindir}/ferry" unit "${unit}")
string(REPLACE "file:/usr/local/share/doc/ferry/" "file:${docdir}/" unit "${unit}")
file(WRITE "${FERRY_BINARY_DIR}/install/ferry.service" "${unit}")
file(INSTALL DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system" TYPE FILE
     PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
     FILES "${FERRY_BINARY_DIR}/install/ferry.service")

# Configuration files: /etc whatever the prefix, as the unit expects.
foreach(pair "ferry|${FERRY_SOURCE_DIR}/config/ferry.yml|OWNER_READ OWNER_WRITE GROUP_READ"
             "logrotate.d|${FERRY_SOURCE_DIR}/contrib/logrotate/ferry|OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ")
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 dir)
  list(GET pair 1 src)
  list(GET pair 2 perms)
  separate_arguments(perms)
  get_filename_component(name "${src}" NAME)
  set(dest "/etc/${dir}/${name}")
  if(EXISTS "$ENV{DESTDIR}${dest}")
    message(STATUS "Keeping: $ENV{DESTDIR}${dest} (exists; the new one is ${src})")
  else()
    file(INSTALL DESTINATION "/etc/${dir}" TYPE FILE PERMISSIONS ${perms} FILES "${src}")
  endif()
endforeach()
