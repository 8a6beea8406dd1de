/* The physical limit of a masquerade ADD: a measuring stick, never shipped.
 *
 * Makes the kernel calls podgate-router's masquerade ADD (vpn-gateway:
 * ip_forward=1 + one masquerade rule) must make, with the same bytes, and
 * nothing else: no config parsing, no planning, no allocation beyond libc's
 * start-up. The bytes come from the router itself: driver.py runs one router
 * ADD under `strace -f -e write=all`, captures every netlink message it sends,
 * the record, the log line and the CNI result, and writes them into
 * masq_ref.h (generated, never committed); run.sh compiles this file
 * statically against that header. So the reference follows the router: when
 * the router stops making a call, so does the reference.
 *
 * In order, as the router does them:
 *   open the pod netns + NS_GET_NSTYPE (the check that it is a network ns),
 *   mkdir the state dir, open + flock its lock, look for an earlier record,
 *   setns() into the pod (the main thread, its own netns opened first to
 *     come back to): open each sysctl file O_RDWR and the NETLINK_NETFILTER
 *     socket (ext ack, capped acks, timeouts), setns() back; everything
 *     after it runs through those handles,
 *   read each sysctl (pread),
 *   node netlink: the NETLINK_ROUTE socket (strict checking, ext ack, receive
 *     timeout) if the router opened one, and every request the router sent on
 *     it (none for a masquerade-only profile), answers read to the end,
 *   list the state dir (the router reads every record for pool ownership),
 *   the file changes the router made before the pod side's first change
 *     (the write-ahead record),
 *   write each sysctl that differs (pwrite), the nf_tables batch, read acks
 *     up to the last one,
 *   the file changes after it, in the router's order: records (temp file
 *     written, renamed), the log line appended; the result written to stdout.
 * Left out, as overhead rather than the ADD's work: the Rust runtime's start-up
 * calls (/proc/self/maps, sigaltstack, signal handlers), the capability check
 * through /proc/self/status, getsockname after bind, and the netns cookie
 * (getsockopt SO_NETNS_COOKIE on the nf_tables socket).
 * Each of those is a gap between the two measurements, on purpose.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/time.h>
#include <unistd.h>

enum { F_END, F_WRITE, F_APPEND, F_RENAME, F_UNLINK };
struct fop {
    int kind;
    const char *path, *path2; /* rename: from, to */
    const char *bytes;
    size_t len;
};

#include "masq_ref.h"

#ifndef NETLINK_GET_STRICT_CHK
#define NETLINK_GET_STRICT_CHK 12
#endif
#ifndef NETLINK_EXT_ACK
#define NETLINK_EXT_ACK 11
#endif
#ifndef NETLINK_CAP_ACK
#define NETLINK_CAP_ACK 10
#endif
#define NS_GET_NSTYPE 0xb703

static unsigned char buf[64 * 1024];
static int ns_fd = -1, nft_fd = -1;

static void die(const char *what) {
    fprintf(stderr, "masq_ref: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int opt(int fd, int level, int name, const void *v, socklen_t n) {
    return setsockopt(fd, level, name, v, n);
}

static int nl_socket(int proto, int route) {
    int one = 1;
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
    int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, proto);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
        return -1;
    if (route) {
        struct timeval tv = {5, 0};
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
            opt(fd, SOL_NETLINK, NETLINK_GET_STRICT_CHK, &one, sizeof one) != 0 ||
            opt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof one) != 0 ||
            opt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
            return -1;
    } else {
        struct timeval tv = {2, 0};
        if (opt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof one) != 0 ||
            opt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof one) != 0 ||
            opt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
            opt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0)
            return -1;
    }
    return fd;
}

/* Read answers until the one that ends request `seq`: NLMSG_DONE of a dump,
 * or the ack (NLMSG_ERROR) of the message with that sequence number. */
static void read_until(int fd, unsigned seq, const char *what) {
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0)
            die(what);
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_seq != seq)
                continue;
            if (h->nlmsg_type == NLMSG_DONE)
                return;
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *e = NLMSG_DATA(h);
                if (e->error != 0) {
                    errno = -e->error;
                    die(what);
                }
                return;
            }
        }
    }
}

#define N_SYSCTLS (sizeof ref_sysctls / sizeof ref_sysctls[0])
static int sysctl_fd[N_SYSCTLS];

/* The pod side only opens handles, on the main thread moved into the pod's
 * namespace and back (as the router's NetNs::open_in): the sysctl files and
 * the nf_tables socket stay bound to the pod's namespace. */
static void pod_side(void) {
    int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (home < 0)
        die("own netns");
    if (setns(ns_fd, CLONE_NEWNET) != 0)
        die("setns");
    for (size_t i = 0; i < N_SYSCTLS; i++) {
        sysctl_fd[i] = open(ref_sysctls[i].path, O_RDWR | O_CLOEXEC);
        if (sysctl_fd[i] < 0)
            die(ref_sysctls[i].path);
    }
    nft_fd = nl_socket(NETLINK_NETFILTER, 0);
    if (nft_fd < 0)
        die("nf_tables socket");
    if (setns(home, CLONE_NEWNET) != 0)
        die("setns back");
    close(home);
}

static void write_file(const char *path, int flags, const char *body, size_t len) {
    int fd = open(path, flags | O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, body, len) != (ssize_t)len)
        die(path);
    close(fd);
}

/* The router's file changes, in its order: records (temp file + rename),
 * log lines, removals. */
static void file_ops(const struct fop *op) {
    for (; op->kind != F_END; op++) {
        switch (op->kind) {
        case F_WRITE:
            write_file(op->path, O_TRUNC, op->bytes, op->len);
            break;
        case F_APPEND:
            write_file(op->path, O_APPEND, op->bytes, op->len);
            break;
        case F_RENAME:
            if (rename(op->path, op->path2) != 0)
                die(op->path2);
            break;
        case F_UNLINK:
            if (unlink(op->path) != 0 && errno != ENOENT)
                die(op->path);
            break;
        }
    }
}

int main(void) {

    ns_fd = open(REF_POD_NETNS, O_RDONLY | O_CLOEXEC);
    if (ns_fd < 0 || ioctl(ns_fd, NS_GET_NSTYPE) != CLONE_NEWNET)
        die("pod netns");
    if (mkdir(REF_STATE_DIR, 0700) != 0 && errno != EEXIST)
        die("state dir");
    int lock = open(REF_STATE_DIR "/.lock", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    if (lock < 0)
        die("lock");
    while (flock(lock, LOCK_EX | LOCK_NB) != 0) {
        if (errno != EWOULDBLOCK)
            die("flock");
        usleep(1000);
    }
    int old = open(REF_STATE_DIR "/" REF_RECORD_NAME, O_RDONLY | O_CLOEXEC);
    if (old >= 0) {
        errno = EEXIST;
        die("record exists (run DEL first)");
    }

    pod_side();
    /* Read before write, as the router does; write when it differs. */
    int differs[N_SYSCTLS];
    for (size_t i = 0; i < N_SYSCTLS; i++) {
        char cur[512];
        ssize_t n = pread(sysctl_fd[i], cur, sizeof cur, 0);
        if (n < 0)
            die(ref_sysctls[i].path);
        while (n > 0 && cur[n - 1] == '\n')
            n--;
        differs[i] = !((size_t)n == ref_sysctls[i].len && memcmp(cur, ref_sysctls[i].value, n) == 0);
    }

    int node = REF_NODE_SOCKET ? nl_socket(NETLINK_ROUTE, 1) : -2;
    if (node == -1)
        die("node netlink socket");
    for (size_t i = 0; i < sizeof ref_node / sizeof ref_node[0]; i++) {
        if (ref_node[i].len == 0)
            continue;
        if (send(node, ref_node[i].bytes, ref_node[i].len, 0) != (ssize_t)ref_node[i].len)
            die("node netlink send");
        read_until(node, ref_node[i].seq, "node netlink");
    }

    DIR *d = opendir(REF_STATE_DIR);
    if (!d)
        die("list state dir");
    for (struct dirent *e; (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] == '.' || l < 5 || strcmp(e->d_name + l - 5, ".json") != 0)
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            while (read(fd, buf, sizeof buf) > 0) {
            }
            close(fd);
        }
    }
    closedir(d);
    file_ops(ref_files_pre);

    for (size_t i = 0; i < N_SYSCTLS; i++) {
        if (differs[i] && pwrite(sysctl_fd[i], ref_sysctls[i].value, ref_sysctls[i].len, 0) < 0)
            die(ref_sysctls[i].path);
    }

    if (send(nft_fd, ref_nft, sizeof ref_nft - 1, 0) != (ssize_t)(sizeof ref_nft - 1))
        die("nf_tables send");
    read_until(nft_fd, REF_NFT_LAST_SEQ, "nf_tables batch");
    close(nft_fd);
    if (node >= 0)
        close(node);

    /* The router names its temp record after its pid. */
    (void)getpid();
    file_ops(ref_files_post);
    if (write(1, ref_stdout, sizeof ref_stdout - 1) < 0)
        die("stdout");
    for (size_t i = 0; i < N_SYSCTLS; i++)
        close(sysctl_fd[i]);
    close(lock);
    close(ns_fd);
    return 0;
}
