/* takeover_wire.c - the takeover's frames (takeover.c's header comment has
 * the conversation): a header (payload length, type | fd count << 16, both
 * uint32 in host order: both ends run on one machine) and a payload, fds
 * riding (SCM_RIGHTS) on the sendmsg that carries the header's first byte;
 * and the session state a TK_SESSION frame carries, written by the old
 * process and read back, into a session, by the new one. */
#include "takeover_wire.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#define link posix_link /* unistd.h's link(2) would clash with ferry's link type */
#include <unistd.h>
#undef link

#include "log.h"
#include "session.h"
#include "subs.h"
#include "takeover.h"
#include "upstream.h"

/* ----------------------------------------------------------------- frames */

void tkw_put_u32(buf *b, uint32_t v)
{
    buf_append(b, &v, sizeof(v));
}

void tkw_put_i64(buf *b, int64_t v)
{
    buf_append(b, &v, sizeof(v));
}

void tkw_put_bytes(buf *b, const void *p, size_t n)
{
    tkw_put_u32(b, (uint32_t)n);
    buf_append(b, p, n);
}

static int rd_take(tkw_rd *r, void *out, size_t n)
{
    if (r->bad || r->n < n) {
        r->bad = 1;
        memset(out, 0, n);
        return -1;
    }
    memcpy(out, r->p, n);
    r->p += n;
    r->n -= n;
    return 0;
}

uint32_t tkw_get_u32(tkw_rd *r)
{
    uint32_t v;
    rd_take(r, &v, sizeof(v));
    return v;
}

int64_t tkw_get_i64(tkw_rd *r)
{
    int64_t v;
    rd_take(r, &v, sizeof(v));
    return v;
}

/* Borrowed pointer into the payload; *n its length. */
const char *tkw_get_bytes(tkw_rd *r, size_t *n)
{
    uint32_t len = tkw_get_u32(r);
    if (r->bad || r->n < len) {
        r->bad = 1;
        *n = 0;
        return "";
    }
    const char *p = r->p;
    r->p += len;
    r->n -= len;
    *n = len;
    return p;
}

uint64_t tkw_mono_ms(void)
{
    return uv_hrtime() / 1000000;
}

/* Send one frame on fd, its fds attached to its first byte, waiting at most
 * timeout_ms for room. Returns 0 or a negative uv error. */
int tkw_send(int fd, int type, const buf *payload, const int *fds, int nfds, uint64_t timeout_ms)
{
    buf b;
    uint32_t hdr[2] = {(uint32_t)buf_used(payload), (uint32_t)type | (uint32_t)nfds << 16};
    uint64_t deadline = tkw_mono_ms() + timeout_ms;
    size_t off = 0;
    int rc = 0;

    ferry_assert(nfds >= 0 && nfds <= TAKEOVER_MAX_FDS);
    buf_init(&b);
    buf_reserve(&b, sizeof(hdr) + buf_used(payload)); /* one block, wiped when freed */
    buf_append(&b, hdr, sizeof(hdr));
    buf_append(&b, buf_head(payload), buf_used(payload));
    while (off < buf_used(&b)) {
        union {
            struct cmsghdr h;
            char space[CMSG_SPACE(sizeof(int) * TAKEOVER_MAX_FDS)];
        } cm;
        struct iovec iov = {.iov_base = buf_head(&b) + off, .iov_len = buf_used(&b) - off};
        struct msghdr mh;
        memset(&mh, 0, sizeof(mh));
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        if (off == 0 && nfds > 0) {
            memset(&cm, 0, sizeof(cm));
            mh.msg_control = cm.space;
            mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
        }
        ssize_t n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            uint64_t now = tkw_mono_ms();
            if (now >= deadline) {
                rc = UV_ETIMEDOUT;
                break;
            }
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, (int)(deadline - now));
            continue;
        }
        rc = n < 0 ? -errno : UV_EPIPE;
        break;
    }
    buf_free_secret(&b); /* a session's frame carries its user's password */
    return rc;
}

/* Read what the control socket has. Returns the bytes read (> 0), 0 at EOF,
 * UV_EAGAIN, or a negative uv error. Received fds join the queue. */
int tkw_recv(tkw_rx *tk, int fd)
{
    union {
        struct cmsghdr h;
        char space[CMSG_SPACE(sizeof(int) * TAKEOVER_MAX_FDS)];
    } cm;
    struct msghdr mh;
    struct iovec iov;
    ssize_t n;

    buf_reserve_secret(&tk->rx, 64 * 1024); /* session frames carry passwords */
    iov.iov_base = tk->rx.data + tk->rx.len;
    iov.iov_len = tk->rx.cap - tk->rx.len;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cm.space;
    mh.msg_controllen = sizeof(cm.space);
    do {
        n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        return errno == EAGAIN || errno == EWOULDBLOCK ? UV_EAGAIN : -errno;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        int *in = (int *)CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            if (tk->nfdq < TAKEOVER_FDQ) {
                tk->fdq[tk->nfdq++] = in[i];
            } else {
                close(in[i]);
                tk->bad = 1;
            }
        }
    }
    if (mh.msg_flags & MSG_CTRUNC) {
        tk->bad = 1; /* fds were dropped by the kernel */
    }
    tk->rx.len += (size_t)n;
    return (int)n;
}

/* The next complete frame: 1 (type, payload and fds filled; consume it with
 * tkw_consume), 0 when incomplete, -1 on a protocol error. */
int tkw_frame(tkw_rx *tk, int *type, tkw_rd *payload, int *fds, int *nfds)
{
    uint32_t hdr[2];
    if (tk->bad) {
        return -1;
    }
    if (buf_used(&tk->rx) < TAKEOVER_HDR) {
        return 0;
    }
    memcpy(hdr, buf_head(&tk->rx), sizeof(hdr));
    if (buf_used(&tk->rx) - TAKEOVER_HDR < hdr[0]) {
        return 0;
    }
    *type = (int)(hdr[1] & 0xffff);
    *nfds = (int)(hdr[1] >> 16);
    if (*nfds > TAKEOVER_MAX_FDS || *nfds > tk->nfdq) {
        tk->bad = 1;
        return -1;
    }
    memcpy(fds, tk->fdq, sizeof(int) * (size_t)*nfds);
    memmove(tk->fdq, tk->fdq + *nfds, sizeof(int) * (size_t)(tk->nfdq - *nfds));
    tk->nfdq -= *nfds;
    payload->p = buf_head(&tk->rx) + TAKEOVER_HDR;
    payload->n = hdr[0];
    payload->bad = 0;
    return 1;
}

void tkw_consume(tkw_rx *tk, const tkw_rd *payload)
{
    buf_consume(&tk->rx, (size_t)(payload->p + payload->n - buf_head(&tk->rx)));
}

void tkw_close_fds(const int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0) {
            close(fds[i]);
        }
    }
}

/* ---------------------------------------------------- a session's state */

void tkw_session(buf *b, const session *s, const buf *call, int64_t left, uint64_t now)
{
    tkw_put_u32(b, s->io.h.type == UV_NAMED_PIPE);
    tkw_put_u32(b, (uint32_t)s->proto);
    tkw_put_u32(b, (uint32_t)s->authed);
    tkw_put_u32(b, (uint32_t)s->sticky);
    tkw_put_u32(b, (uint32_t)s->tracking);
    tkw_put_u32(b, s->tunnel == TUN_PUBSUB || s->tunnel == TUN_PUBSUB_LOST);
    tkw_put_u32(b, (uint32_t)s->db);
    tkw_put_i64(b, left);
    tkw_put_i64(b, (int64_t)s->id);
    tkw_put_i64(b, (int64_t)(now >= s->last_active_ms ? now - s->last_active_ms : 0));
    uint64_t partial_since = session_extra_r(s)->partial_since_ms;
    tkw_put_i64(b, (int64_t)(partial_since != 0 && now >= partial_since ? now - partial_since : 0));
    const char *peer = session_peer(s);
    tkw_put_bytes(b, peer, strlen(peer));
    /* CLIENT SETNAME/TRACKING... as Redis accepted them: replayed on the
     * link the new process lends (as after a failover). */
    const buf *settings = &session_extra_r(s)->sticky_log;
    tkw_put_bytes(b, buf_used(settings) > 0 ? buf_head(settings) : "", buf_used(settings));
    tkw_put_bytes(b, buf_head(call), buf_used(call));
    /* Unparsed input, an incomplete request included: parsed again from its
     * first byte there (the parser's state here is only a resume point). */
    const buf *in = &session_extra_r(s)->in;
    tkw_put_bytes(b, buf_used(in) > 0 ? buf_head(in) : "", buf_used(in));
    for (int i = 0; i < 3; i++) {
        const sub_set *set = s->subs == NULL ? NULL
                             : i == 0        ? &s->subs->channels
                             : i == 1        ? &s->subs->patterns
                                             : &s->subs->shards;
        tkw_put_u32(b, set == NULL ? 0 : (uint32_t)set->n);
        for (size_t j = 0; set != NULL && j < set->n; j++) {
            tkw_put_bytes(b, set->v[j], set->l[j]); /* in subscription order */
        }
    }
    /* client.auth redis: the Redis user it runs as, and the password Redis
     * last accepted for that user, with which the new process opens the
     * user's links if it has none (the control socket is reachable only
     * by ferry's own system user, and the password is in this process's
     * memory anyway). Last, with room made first: b does not grow (leaving
     * a copy behind) once the password is in it, and is wiped when freed. */
    const ident *id = s->ident;
    size_t nuser = id != NULL ? strlen(id->user) : 0;
    size_t npass = id != NULL ? strlen(id->pass) : 0;
    buf_reserve(b, 3 * sizeof(uint32_t) + nuser + npass);
    tkw_put_u32(b, id != NULL);
    tkw_put_bytes(b, id != NULL ? id->user : "", nuser);
    tkw_put_bytes(b, id != NULL ? id->pass : "", npass);
}

/* New process: the state tkw_session wrote, restored on a session of f. */
int takeover_adopt(ferry *f, int fd, char *frame, size_t len)
{
    tkw_rd pr = {.p = frame, .n = len, .bad = 0};
    tkw_rd *p = &pr;
    int ok = 0;
    session_import im;
    buf input;
    size_t n;

    memset(&im, 0, sizeof(im));
    im.is_unix = (int)tkw_get_u32(p);
    uint32_t proto = tkw_get_u32(p);
    im.proto = (int)proto;
    im.authed = (int)tkw_get_u32(p);
    im.sticky = (int)tkw_get_u32(p);
    im.tracking = (int)tkw_get_u32(p);
    im.pubsub = (int)tkw_get_u32(p);
    im.db = (int)tkw_get_u32(p);
    int64_t left = tkw_get_i64(p);
    int64_t old_id = tkw_get_i64(p);
    int64_t idle = tkw_get_i64(p);
    int64_t partial = tkw_get_i64(p);
    im.idle_ms = idle > 0 ? (uint64_t)idle : 0;
    im.partial_ms = partial > 0 ? (uint64_t)partial : 0;
    const char *peer = tkw_get_bytes(p, &n);
    char peerz[64];
    snprintf(peerz, sizeof(peerz), "%.*s", (int)n, peer);
    im.settings = tkw_get_bytes(p, &im.nsettings);
    buf_init(&input);
    const char *call = tkw_get_bytes(p, &n);
    buf_append(&input, call, n);
    size_t ncall = n;
    const char *rest = tkw_get_bytes(p, &n);
    buf_append(&input, rest, n);
    for (int i = 0; i < 3 && !p->bad; i++) {
        uint32_t k = tkw_get_u32(p);
        for (uint32_t j = 0; j < k && !p->bad; j++) {
            const char *name = tkw_get_bytes(p, &n);
            if (p->bad) {
                break;
            }
            if (im.subs == NULL) {
                im.subs = sub_sets_new();
            }
            sub_set *set = i == 0   ? &im.subs->channels
                           : i == 1 ? &im.subs->patterns
                                    : &im.subs->shards;
            subs_add(set, name, n);
        }
    }
    if (im.pubsub && im.subs == NULL) {
        im.subs = sub_sets_new(); /* subscribed to nothing yet: the tunnel stays open */
    }
    uint32_t has_user = tkw_get_u32(p);
    const char *user = tkw_get_bytes(p, &im.nuser);
    size_t npass;
    /* Wiped below, in the received bytes, once the session has it. */
    char *pass = (char *)tkw_get_bytes(p, &npass);
    if (has_user) {
        im.user = user;
        im.pass = pass;
        im.npass = npass;
    }
    char userz[80] = "";
    if (has_user) {
        snprintf(userz, sizeof(userz), ", user '%.*s'", (int)(im.nuser < 64 ? im.nuser : 64), user);
    }
    if (p->bad || (proto != 2 && proto != 3) || fd < 0 || (has_user && im.nuser == 0)) {
        log_error("takeover: malformed client from the old process (protocol %u): closed",
                  (unsigned)proto);
        if (fd >= 0) {
            close(fd);
        }
    } else if (f->stopping || f->closed) {
        log_warn("takeover: client %lld %s received while stopping: closed", (long long)old_id,
                 peerz);
        close(fd);
    } else {
        im.input = buf_head(&input);
        im.ninput = buf_used(&input);
        ok = 1;
        log_info("takeover: client %lld %s received (RESP%d%s, db %d%s%s%s%s, %zu byte(s) "
                 "unparsed)",
                 (long long)old_id, peerz, im.proto, userz, im.db, im.pubsub ? ", subscribed" : "",
                 im.nsettings > 0 ? ", connection settings" : "",
                 ncall == 0                ? ""
                 : left == TKW_LEFT_UNSENT ? ", requests held unsent"
                                           : ", blocked call",
                 ncall == 0 || left == TKW_LEFT_UNSENT ? ""
                 : left == 0                           ? " without timeout"
                                                       : " with its timeout left",
                 im.ninput - ncall);
        int rc = session_adopt(f, fd, &im);
        if (rc < 0) {
            log_error("takeover: cannot open client %lld: %s", (long long)old_id, uv_strerror(rc));
            close(fd);
            ok = 0;
        }
    }
    if (npass > 0) {
        explicit_bzero(pass, npass); /* the user's ident has its own copy */
    }
    sub_sets_free(im.subs);
    buf_free(&input);
    return ok ? 0 : -1;
}
