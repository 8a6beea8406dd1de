/* A test backend: answers every TCP connection on its port (argument,
 * default 8080) with its host name (the pod's name) and a newline. */
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 8080;
    char name[256] = {0};
    gethostname(name, sizeof(name) - 2);
    size_t len = strlen(name);
    name[len++] = '\n';
    int s = socket(AF_INET6, SOCK_STREAM, 0);
    int off = 0, on = 1;
    setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
    if (bind(s, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(s, 64) != 0)
        return 1;
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0)
            continue;
        (void)!write(c, name, len);
        close(c);
    }
}
