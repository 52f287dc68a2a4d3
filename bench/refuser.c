/* refuser: the least a server can spend refusing an HTTP/1.1 request, for bench_overload.
 *
 * Each request on a keep-alive connection is answered at once with a fixed 503 and
 * Retry-After, the way sordino refuses from the headers (server/early_shed.py): read the
 * headers, skip the body (Content-Length) unread by any parser, write the answer. One
 * thread on epoll, no allocation per request. Its CPU time per refusal, on the core the
 * server would use and at the rate the overload offers, is the floor under any server's
 * refusal on this machine: the read and the write system calls and the loopback stack.
 *
 *   refuser PORT      (listens on 127.0.0.1:PORT, 0 for any free one, until killed;
 *                      prints "ready PORT" once listening)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXFD 65536
#define HEAD 8192

static const char ANSWER[] =
    "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    "content-length: 43\r\nretry-after: 1\r\n\r\n"
    "{\"error\":\"the server is overloaded; retry\"}";

typedef struct {
    long skip;       /* body bytes still to drop */
    size_t have;     /* header bytes buffered */
    char head[HEAD];
} conn_t;

static conn_t *conns[MAXFD];

static long content_length(const char *head, size_t len) {
    const char *p = head, *end = head + len;
    while (p < end) {
        const char *eol = memmem(p, (size_t)(end - p), "\r\n", 2);
        if (eol == NULL) break;
        if ((size_t)(eol - p) > 15 && strncasecmp(p, "content-length:", 15) == 0)
            return strtol(p + 15, NULL, 10);
        p = eol + 2;
    }
    return 0;
}

/* Consume n bytes of the stream on fd: skip bodies, answer each complete header block. */
static int consume(int fd, conn_t *c, const char *data, size_t n) {
    while (n > 0) {
        if (c->skip > 0) {
            size_t drop = (size_t)c->skip < n ? (size_t)c->skip : n;
            c->skip -= (long)drop, data += drop, n -= drop;
            continue;
        }
        size_t take = n < HEAD - c->have ? n : HEAD - c->have;
        memcpy(c->head + c->have, data, take);
        char *end = memmem(c->head, c->have + take, "\r\n\r\n", 4);
        if (end == NULL) {
            if (c->have + take == HEAD) return -1; /* headers too long */
            c->have += take;
            return 0;
        }
        size_t used = (size_t)(end + 4 - c->head) - c->have; /* of this chunk */
        c->skip = content_length(c->head, (size_t)(end - c->head) + 2);
        c->have = 0;
        data += used, n -= used;
        if (write(fd, ANSWER, sizeof ANSWER - 1) < 0) return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: refuser PORT\n");
        return 2;
    }
    int one = 1, listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(listener, 4096) != 0) {
        perror("refuser: bind");
        return 1;
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = listener};
    epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev);
    socklen_t size = sizeof addr;
    getsockname(listener, (struct sockaddr *)&addr, &size);
    printf("ready %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    static struct epoll_event ready[512];
    static char buf[1 << 16];
    for (;;) {
        int n = epoll_wait(ep, ready, 512, -1);
        for (int i = 0; i < n; i++) {
            int fd = ready[i].data.fd;
            if (fd == listener) {
                int client;
                while ((client = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    if (client >= MAXFD) {
                        close(client);
                        continue;
                    }
                    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    if (conns[client] == NULL) conns[client] = malloc(sizeof(conn_t));
                    conns[client]->skip = 0, conns[client]->have = 0;
                    struct epoll_event add = {.events = EPOLLIN, .data.fd = client};
                    epoll_ctl(ep, EPOLL_CTL_ADD, client, &add);
                }
                continue;
            }
            ssize_t got = read(fd, buf, sizeof buf);
            if (got <= 0 || consume(fd, conns[fd], buf, (size_t)got) != 0) close(fd);
        }
    }
}
