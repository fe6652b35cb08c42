/* glob.h - Redis' glob patterns, as KEYS and SCAN MATCH read them. */
#ifndef FERRY_GLOB_H
#define FERRY_GLOB_H

#include <stddef.h>

/* 1 if s[0..slen) matches pattern p[0..plen): *, ?, [abc], [^a], [a-z], \x. */
int glob_match(const char *p, size_t plen, const char *s, size_t slen);

#endif
