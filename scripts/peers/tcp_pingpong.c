/* A raw TCP ping-pong: the round trip of an 8-byte message over one connection with
 * TCP_NODELAY, the reference for small collectives across hosts (scripts/peers/compare_tcp.sh).
 *
 *   tcp_pingpong server ADDR PORT ITERS      (answers ITERS messages, then exits)
 *   tcp_pingpong client ADDR PORT ITERS      (prints {"rtt_us": mean, "iters": ITERS, "bytes": 8})
 *
 * The client sends 8 bytes and waits for the 8 echoed, ITERS times after ITERS/10 untimed
 * warm-up rounds; the mean round trip is printed as one JSON line. Blocking sockets, no
 * busy polling: what a plain socket program gets from the kernel. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int exact(int fd, char *buf, int len, int writing) {
    int done = 0;
    while (done < len) {
        ssize_t n = writing ? send(fd, buf + done, len - done, MSG_NOSIGNAL) : recv(fd, buf + done, len - done, 0);
        if (n <= 0) return -1;
        done += (int)n;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s server|client ADDR PORT ITERS\n", argv[0]);
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0, iters = atoi(argv[4]), one = 1, fd;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[3]))};
    if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1 || iters <= 0) return 2;
    int warm = iters / 10 + 1;
    if (server) {
        int ls = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1)) { perror("listen"); return 1; }
        fd = accept(ls, NULL, NULL);
        close(ls);
    } else {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        for (int t = 0; connect(fd, (struct sockaddr *)&a, sizeof a); t++) {
            if (t == 50) { perror("connect"); return 1; }
            close(fd);
            usleep(100000);
            fd = socket(AF_INET, SOCK_STREAM, 0);
        }
    }
    if (fd < 0) { perror("socket"); return 1; }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char msg[8] = {0};
    struct timespec t0 = {0}, t1;
    for (int i = 0; i < warm + iters; i++) {
        if (!server && i == warm) clock_gettime(CLOCK_MONOTONIC, &t0);
        if (server ? exact(fd, msg, 8, 0) || exact(fd, msg, 8, 1) : exact(fd, msg, 8, 1) || exact(fd, msg, 8, 0)) {
            fprintf(stderr, "the connection ended at round %d\n", i);
            return 1;
        }
    }
    if (!server) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) / 1e3 / iters;
        printf("{\"rtt_us\": %.2f, \"iters\": %d, \"bytes\": 8}\n", us, iters);
    }
    close(fd);
    return 0;
}
