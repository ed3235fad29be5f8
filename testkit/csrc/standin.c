/* A static stand-in for a node's long-running binaries (pause, etcd,
 * kube-apiserver, ...): it waits until SIGTERM or SIGINT, then exits 0.
 * Built with `gcc -static` by the tests; the image's entrypoint.
 * With the argument `exit`, it exits at once with status 1 (a control
 * plane that cannot start). */
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "exit") == 0) return 1;
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    for (;;) pause();
}
