# package.cmake - what `cmake --install` lays out and how `cpack -G DEB`
# packs it (included by CMakeLists.txt):
#   <prefix>/bin/ferry
#   /etc/ferry/ferry.yml                  config/ferry.yml (kept if present)
#   /etc/logrotate.d/ferry                contrib/logrotate/ferry (kept if present)
#   <prefix>/lib/systemd/system/ferry.service
#                                         scripts/ferry.service, with this prefix
#   <prefix>/share/man/man1/ferry.1.gz    man/ferry.1.in
#   <prefix>/share/doc/ferry/             README.md, ferry-rules.yml, copyright
#                                         (contrib/deb/copyright, Debian's
#                                         machine-readable format)
#   <prefix>/share/doc/ferry/docs/        docs/*.md
# The Debian package installs with prefix /usr, depends on the packages of
# the libraries ferry links (dpkg-shlibdeps) and runs contrib/deb/'s
# maintainer scripts (the ferry user, the configuration's group).
include(GNUInstallDirs)

configure_file(${CMAKE_SOURCE_DIR}/man/ferry.1.in ${CMAKE_BINARY_DIR}/man/ferry.1 @ONLY)
add_custom_command(OUTPUT ${CMAKE_BINARY_DIR}/man/ferry.1.gz
                   COMMAND gzip -9nkf ${CMAKE_BINARY_DIR}/man/ferry.1
                   DEPENDS ${CMAKE_BINARY_DIR}/man/ferry.1
                   COMMENT "Compressing the man page")
add_custom_target(manpage ALL DEPENDS ${CMAKE_BINARY_DIR}/man/ferry.1.gz)

install(TARGETS ferry RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${CMAKE_BINARY_DIR}/man/ferry.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${CMAKE_SOURCE_DIR}/contrib/prometheus/ferry-rules.yml
              ${CMAKE_SOURCE_DIR}/contrib/deb/copyright
        DESTINATION ${CMAKE_INSTALL_DOCDIR})
file(GLOB FERRY_DOCS ${CMAKE_SOURCE_DIR}/docs/*.md)
install(FILES ${FERRY_DOCS} DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs)
install(CODE "set(FERRY_SOURCE_DIR \"${CMAKE_SOURCE_DIR}\")
set(FERRY_BINARY_DIR \"${CMAKE_BINARY_DIR}\")
set(FERRY_BINDIR \"${CMAKE_INSTALL_BINDIR}\")
set(FERRY_DOCDIR \"${CMAKE_INSTALL_DOCDIR}\")")
install(SCRIPT ${CMAKE_SOURCE_DIR}/cmake/install_files.cmake)

# --- cpack -G DEB ------------------------------------------------------------
set(FERRY_DEB_MAINTAINER "ferry developers <developers@ferry.example>"
    CACHE STRING "Maintainer field of the Debian package")
# Build trees configured before kept a placeholder address in their cache.
if(FERRY_DEB_MAINTAINER MATCHES "@ferry\\.invalid>$")
  set_property(CACHE FERRY_DEB_MAINTAINER PROPERTY VALUE "ferry developers <developers@ferry.example>")
endif()
set(CPACK_PACKAGE_NAME ferry)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${FERRY_DEB_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "high-availability RESP proxy for Redis queue workloads")
set(CPACK_PACKAGE_DESCRIPTION
    "ferry stands between applications and a Redis master (fixed, or the one
Redis Sentinel announces): it follows failovers, holds requests while no
master is usable and sends them on to the next one, forces AOF fsync on
every write, and keeps queue writes in a local SQLite store while no Redis
is reachable, replaying them once a master is back.")
set(CPACK_GENERATOR DEB)
# The configuration and logrotate files go to /etc whatever the prefix: let
# cpack install into its staging tree through DESTDIR, so that they land
# there and not on this machine.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "logrotate")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "redis-server, redis-sentinel, prometheus")
set(FERRY_DEB_CONFFILES ${CMAKE_BINARY_DIR}/deb/conffiles)
file(WRITE ${FERRY_DEB_CONFFILES} "/etc/ferry/ferry.yml\n/etc/logrotate.d/ferry\n")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/contrib/deb/postinst ${CMAKE_SOURCE_DIR}/contrib/deb/prerm
    ${CMAKE_SOURCE_DIR}/contrib/deb/postrm ${FERRY_DEB_CONFFILES})
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
include(CPack)
