/* The pod sandbox's process for the real node (tests/e2e/images.py): holds the pod's
 * namespaces, reaps the zombies of a shared PID namespace, ends on SIGINT or SIGTERM. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

static void leave(int sig) {
    (void)sig;
    _exit(0);
}

int main(void) {
    signal(SIGINT, leave);
    signal(SIGTERM, leave);
    signal(SIGCHLD, reap);
    for (;;) {
        pause();
    }
}
