/* A static stand-in for a node's long-running binaries (pause, etcd,
 * kube-apiserver, ...): it waits until SIGTERM or SIGINT, then exits 0.
 * Built with `gcc -static` by the tests; the image's entrypoint.
 * With the argument `exit`, it exits at once with status 1 (a control
 * plane that cannot start). With KILN_STANDIN_MARK set, it first appends
 * a line to that file: the tests' proof that something ran it. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

int main(int argc, char **argv) {
    const char *mark = getenv("KILN_STANDIN_MARK");
    if (mark) {
        int fd = open(mark, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            (void)!write(fd, "ran\n", 4);
            close(fd);
        }
    }
    if (argc > 1 && strcmp(argv[1], "exit") == 0) return 1;
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;) pause();
}
