/* The sandbox's pause process: sleeps until told to stop. */
#include <signal.h>
#include <unistd.h>
static void bye(int s) { (void)s; _exit(0); }
int main(void) {
    signal(SIGINT, bye);
    signal(SIGTERM, bye);
    for (;;) pause();
}
