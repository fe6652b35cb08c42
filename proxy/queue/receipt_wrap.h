/* receipt_wrap.h - a client's Lua script run inside a wrapper that keeps
 * its reply under a receipt key (durability.script_receipts, receipts.c). */
#ifndef FERRY_RECEIPT_WRAP_H
#define FERRY_RECEIPT_WRAP_H

#include <stddef.h>

#include "buf.h"

/* body (n bytes) wrapped, appended to out (0); -1, nothing appended, when
 * it declares itself read-only (a '#!lua' line with flags=no-writes) or its
 * first line is a shebang ferry does not know. The wrapped script takes
 * one key and one argument more, each last: the receipt, and '1' when it
 * was sent before (the receipt looked at first), else '0'. */
int receipt_wrap(const char *body, size_t n, buf *out);

/* An error reply of the wrapped script (p, n) that names the wrapper's
 * SHA1 ('script: <sha1>', as Redis 7.0 writes a script's runtime errors)
 * with the client's script's (sha) instead, in out (1); 0 when it names
 * none (p is the client's reply as it is). */
int receipt_wrap_error(const char *p, size_t n, const char sha[41], buf *out);

#endif
