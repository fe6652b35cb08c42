/* glob.c - Redis' glob patterns (KEYS, SCAN MATCH), matched by ferry where it
 * must agree with Redis: fallback.keys, queues[].keys. */
#include "glob.h"

/* Redis' glob (KEYS syntax): *, ?, [abc], [^a], [a-z], \x. */
int glob_match(const char *p, size_t plen, const char *s, size_t slen)
{
    while (plen > 0) {
        switch (*p) {
        case '*':
            while (plen > 1 && p[1] == '*') {
                p++;
                plen--;
            }
            if (plen == 1) {
                return 1;
            }
            for (size_t i = 0; i <= slen; i++) {
                if (glob_match(p + 1, plen - 1, s + i, slen - i)) {
                    return 1;
                }
            }
            return 0;
        case '?':
            if (slen == 0) {
                return 0;
            }
            s++;
            slen--;
            break;
        case '[': {
            int neg, match = 0;
            if (slen == 0) {
                return 0;
            }
            p++;
            plen--;
            neg = plen > 0 && *p == '^';
            if (neg) {
                p++;
                plen--;
            }
            while (plen > 0 && *p != ']') {
                if (*p == '\\' && plen >= 2) {
                    p++;
                    plen--;
                    match |= *p == *s;
                } else if (plen >= 3 && p[1] == '-' && p[2] != ']') {
                    char lo = p[0] < p[2] ? p[0] : p[2], hi = p[0] < p[2] ? p[2] : p[0];
                    match |= *s >= lo && *s <= hi;
                    p += 2;
                    plen -= 2;
                } else {
                    match |= *p == *s;
                }
                p++;
                plen--;
            }
            if (plen == 0 || match == neg) {
                return 0;
            }
            s++;
            slen--;
            break;
        }
        case '\\':
            if (plen >= 2) {
                p++;
                plen--;
            }
            /* fall through */
        default:
            if (slen == 0 || *p != *s) {
                return 0;
            }
            s++;
            slen--;
            break;
        }
        p++;
        plen--;
    }
    return slen == 0;
}
