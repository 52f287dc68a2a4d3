/* openloop: a lean open-loop (or closed-loop) HTTP/1.1 load generator for bench_overload.
 *
 * Why hand-written: no open-loop HTTP generator installs from PyPI or Debian (wrk and ab
 * are closed-loop: they wait for an answer before sending again, so a stalled server
 * slows the client and hides the stall; wrk2 is not packaged). The Python client this
 * replaces reached only half of a 3x rate from one core. This one is a single thread on
 * epoll: prebuilt request bytes, keep-alive connections opened as needed (at most one
 * request in flight on each), a fixed send schedule whatever the answers do, and each
 * latency measured from the request's *intended* send time (so time spent waiting for a
 * free connection, in socket buffers or in the server all counts).
 *
 *   openloop open   HOST PORT RATE SECONDS CONNS HIGH_SHARE SEED HIGH_REQ LOW_REQ OUT
 *   openloop closed HOST PORT CONCURRENCY SECONDS REQ OUT
 *
 * The open loop opens its CONNS connections before it starts. HIGH_REQ / LOW_REQ / REQ
 * are files holding one complete request each; LOW_REQ "-" sends the same schedule's
 * high-priority requests only (each low one falls due and is not sent). OUT gets one
 * line per request, "high status latency_us" (status 0: the connection failed or closed
 * before the answer; -1: no answer when the run ended, 5 s after the last send; -2: not
 * sent, a low one under LOW_REQ "-"). The last line of stderr is "sent N in S s".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF 65536
#define DRAIN_NS 5000000000LL

typedef struct {
    int fd;
    int in_ring;       /* listed in the idle ring (maybe stale: checked when popped) */
    int connecting;    /* a non-blocking connect not yet complete */
    long req;          /* request in flight, -1 when idle */
    size_t sent;       /* bytes of it written */
    size_t len;        /* bytes in buf */
    char buf[BUF];
} conn_t;

typedef struct {
    int64_t intended;  /* ns */
    int32_t status;    /* -1 until answered */
    int8_t high;
    int64_t done;
} req_t;

static struct sockaddr_in addr;
static int ep;
static conn_t *conns;
static int nconns, maxconns, live;
static int64_t last_send;
static int *idle, nidle, idle_head; /* FIFO ring of idle connection indices */
static long *waiting, nwaiting, wait_head, wait_cap; /* FIFO of requests due, not sent */
static req_t *reqs;
static const char *bodies[2];
static size_t body_len[2];
static int closed_loop, skip_lows;
static long nreqs, answered, skipped;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(2); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *data = malloc(n);
    if (fread(data, 1, n, f) != (size_t)n) { perror(path); exit(2); }
    fclose(f);
    *len = (size_t)n;
    return data;
}

static void push_idle(int c) {
    if (conns[c].in_ring) return;
    conns[c].in_ring = 1;
    idle[(idle_head + nidle++) % maxconns] = c;
}

static int pop_idle(void) {
    int c = idle[idle_head];
    idle_head = (idle_head + 1) % maxconns;
    nidle--;
    conns[c].in_ring = 0;
    return c;
}

/* A new connection, connecting without blocking: a blocking connect would stall every
   other connection (and the schedule) for seconds when the server's accept queue is
   full and the kernel retries the SYN. */
static int open_conn(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int connecting = 0;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (errno != EINPROGRESS) { close(fd); return -1; }
        connecting = 1;
    }
    int c = nconns;
    for (int i = 0; i < nconns; i++) if (conns[i].fd < 0) { c = i; break; }
    if (c == nconns) nconns++;
    conns[c].fd = fd;
    conns[c].connecting = connecting;
    conns[c].req = -1;
    conns[c].len = 0;
    live++;
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)c};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    return c;
}

static void finish(long r, int status, int64_t t) {
    reqs[r].status = status;
    reqs[r].done = t;
    answered++;
}

static void drop_conn(int c, int64_t t) {
    conn_t *k = &conns[c];
    if (k->req >= 0) finish(k->req, 0, t);
    epoll_ctl(ep, EPOLL_CTL_DEL, k->fd, NULL);
    close(k->fd);
    k->fd = -1;
    k->req = -1;
    live--;
    /* An idle connection the server closed stays in the idle ring; pop skips it. */
}

static void flush(int c) {
    conn_t *k = &conns[c];
    if (k->connecting) return; /* EPOLLOUT says when it may write */
    const char *data = bodies[reqs[k->req].high];
    size_t len = body_len[reqs[k->req].high];
    while (k->sent < len) {
        ssize_t n = write(k->fd, data + k->sent, len - k->sent);
        if (n < 0) {
            if (errno == EAGAIN) break;
            drop_conn(c, now_ns());
            return;
        }
        k->sent += (size_t)n;
    }
    struct epoll_event ev = {.events = EPOLLIN | (k->sent < len ? EPOLLOUT : 0),
                             .data.u32 = (uint32_t)c};
    epoll_ctl(ep, EPOLL_CTL_MOD, k->fd, &ev);
}

static void send_on(int c, long r) {
    conns[c].req = r;
    conns[c].sent = 0;
    last_send = now_ns();
    flush(c);
}

/* Give waiting requests connections: idle ones first, then new ones up to the cap. */
static void dispatch(void) {
    while (nwaiting > 0) {
        int c = -1;
        while (nidle > 0) {
            int i = pop_idle();
            if (conns[i].fd >= 0 && conns[i].req < 0) { c = i; break; }
        }
        if (c < 0) {
            if (live >= maxconns) return;
            c = open_conn();
            if (c < 0) { /* cannot connect: the request fails as a connection error */
                long r = waiting[wait_head];
                wait_head = (wait_head + 1) % wait_cap;
                nwaiting--;
                finish(r, 0, now_ns());
                continue;
            }
        }
        long r = waiting[wait_head];
        wait_head = (wait_head + 1) % wait_cap;
        nwaiting--;
        send_on(c, r);
    }
}

static void enqueue(long r) {
    waiting[(wait_head + nwaiting++) % wait_cap] = r;
}

/* Parse whole responses out of the connection's buffer. */
static void on_readable(int c, int64_t t) {
    conn_t *k = &conns[c];
    for (;;) {
        ssize_t n = read(k->fd, k->buf + k->len, BUF - k->len);
        if (n == 0 || (n < 0 && errno != EAGAIN)) { drop_conn(c, t); return; }
        if (n < 0) break;
        k->len += (size_t)n;
        if (k->len == BUF) break;
    }
    for (;;) {
        char *end = memmem(k->buf, k->len, "\r\n\r\n", 4);
        if (!end) return;
        size_t head = (size_t)(end - k->buf) + 4;
        end[2] = 0; /* terminate the head for the searches below */
        char *cl = strcasestr(k->buf, "\ncontent-length:");
        size_t body = cl ? strtoul(cl + 16, NULL, 10) : 0;
        int close_after = strcasestr(k->buf, "\nconnection: close") != NULL;
        end[2] = '\r';
        if (k->len < head + body) return;
        int status = atoi(k->buf + 9);
        memmove(k->buf, k->buf + head + body, k->len - head - body);
        k->len -= head + body;
        long r = k->req;
        k->req = -1;
        if (r >= 0) finish(r, status, t);
        if (close_after) { drop_conn(c, t); return; }
        push_idle(c);
    }
}

/* Open loop: open every connection before the schedule starts, as a client's warm pool
   would be, so the run measures the server under load rather than a storm of SYNs (a
   SYN dropped from a full accept queue is retried after 1, 3, 7 s). */
static void preopen(void) {
    struct epoll_event events[256];
    for (int i = 0; i < maxconns; i++) if (open_conn() < 0) break;
    int64_t give_up = now_ns() + 10000000000LL;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < nconns; i++) pending += conns[i].fd >= 0 && conns[i].connecting;
        if (pending == 0 || now_ns() > give_up) break;
        int n = epoll_wait(ep, events, 256, 10);
        for (int i = 0; i < n; i++) {
            int c = (int)events[i].data.u32;
            if (conns[c].fd < 0 || !conns[c].connecting) continue;
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(conns[c].fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err) { drop_conn(c, now_ns()); continue; }
            conns[c].connecting = 0;
            struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)c};
            epoll_ctl(ep, EPOLL_CTL_MOD, conns[c].fd, &ev);
        }
    }
    for (int i = 0; i < nconns; i++) if (conns[i].fd >= 0 && !conns[i].connecting) push_idle(i);
    fprintf(stderr, "opened %d connections\n", live);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: see the header of openloop.c\n"); return 2; }
    closed_loop = strcmp(argv[1], "closed") == 0;
    if ((!closed_loop && argc != 12) || (closed_loop && argc != 8)) {
        fprintf(stderr, "wrong number of arguments; see the header of openloop.c\n");
        return 2;
    }
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)atoi(argv[3]));
    if (inet_pton(AF_INET, argv[2], &addr.sin_addr) != 1) { fprintf(stderr, "bad host\n"); return 2; }
    double seconds = atof(argv[5]);
    const char *out;
    double rate = 0, high_share = 0;
    if (closed_loop) {
        maxconns = atoi(argv[4]);
        bodies[0] = bodies[1] = slurp(argv[6], &body_len[0]);
        body_len[1] = body_len[0];
        out = argv[7];
        nreqs = (long)(seconds * 200000) + maxconns; /* room for 200k req/s */
    } else {
        rate = atof(argv[4]);
        maxconns = atoi(argv[6]);
        high_share = atof(argv[7]);
        srand48(atol(argv[8]));
        bodies[1] = slurp(argv[9], &body_len[1]);
        skip_lows = strcmp(argv[10], "-") == 0;
        if (skip_lows) { bodies[0] = bodies[1]; body_len[0] = body_len[1]; }
        else bodies[0] = slurp(argv[10], &body_len[0]);
        out = argv[11];
        nreqs = (long)(rate * seconds);
    }
    if (nreqs <= 0 || maxconns <= 0) { fprintf(stderr, "nothing to send\n"); return 2; }
    conns = calloc((size_t)maxconns, sizeof *conns);
    idle = calloc((size_t)maxconns, sizeof *idle);
    reqs = calloc((size_t)nreqs, sizeof *reqs);
    wait_cap = nreqs + 1;
    waiting = calloc((size_t)wait_cap, sizeof *waiting);
    for (int i = 0; i < maxconns; i++) conns[i].fd = -1;
    ep = epoll_create1(0);
    struct epoll_event events[256];
    if (!closed_loop) preopen();
    int64_t start = now_ns();
    long next = 0; /* next request to schedule */
    int64_t all_due = 0;  /* when the last request fell due (open loop) */
    last_send = start;
    if (closed_loop) {
        for (long r = 0; r < nreqs; r++) { reqs[r].status = -1; reqs[r].intended = -1; }
    } else {
        for (long r = 0; r < nreqs; r++) {
            reqs[r].intended = start + (int64_t)((double)r * 1e9 / rate);
            reqs[r].high = drand48() < high_share;
            reqs[r].status = -1;
        }
    }
    int64_t stop = start + (int64_t)(seconds * 1e9);
    for (;;) {
        int64_t t = now_ns();
        if (closed_loop) {
            /* keep CONCURRENCY requests in flight until the time is up */
            while (t < stop && next < nreqs && next - answered < maxconns) {
                reqs[next].intended = t;
                enqueue(next++);
            }
            if (t >= stop && answered == next) break;
            if (t >= stop + DRAIN_NS) break;
        } else {
            while (next < nreqs && reqs[next].intended <= t) {
                if (skip_lows && !reqs[next].high) { finish(next++, -2, t); skipped++; }
                else enqueue(next++);
            }
            if (next == nreqs) {
                if (all_due == 0) all_due = t;
                if (answered == nreqs || t >= all_due + DRAIN_NS) break;
            }
        }
        dispatch();
        struct timespec timeout = {0, 1000000};
        if (!closed_loop && next < nreqs) {
            int64_t wait = reqs[next].intended - now_ns();
            timeout.tv_nsec = wait <= 0 ? 0 : (wait > 1000000 ? 1000000 : wait);
        }
        /* epoll_pwait2 sleeps to the microsecond: at 10k req/s a send falls due every
           100 us, which epoll_wait's milliseconds could only meet by spinning. */
        int n = epoll_pwait2(ep, events, 256, &timeout, NULL);
        t = now_ns();
        for (int i = 0; i < n; i++) {
            int c = (int)events[i].data.u32;
            if (conns[c].fd < 0) continue;
            if (events[i].events & EPOLLOUT && conns[c].connecting) {
                int err = 0;
                socklen_t len = sizeof err;
                getsockopt(conns[c].fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) { drop_conn(c, t); continue; }
                conns[c].connecting = 0;
            }
            if (events[i].events & EPOLLOUT && conns[c].req >= 0) flush(c);
            if (conns[c].fd >= 0 && events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                on_readable(c, t);
        }
    }
    int64_t end = now_ns();
    FILE *f = fopen(out, "w");
    if (!f) { perror(out); return 2; }
    long count = closed_loop ? next : nreqs;
    for (long r = 0; r < count; r++) {
        long latency = reqs[r].status >= 0 ? (long)((reqs[r].done - reqs[r].intended) / 1000) : -1;
        fprintf(f, "%d %d %ld\n", reqs[r].high, reqs[r].status, latency);
    }
    fclose(f);
    (void)end;
    fprintf(stderr, "sent %ld in %.3f s\n", count - skipped, (double)(last_send - start) / 1e9);
    return 0;
}
