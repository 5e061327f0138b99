/* The pod sandbox's process: holds the pod's namespaces, reaps zombies, exits on SIGINT/SIGTERM.
 * The same job as Kubernetes' build/pause/linux/pause.c, written here so the image is built from source
 * (hack/build-images.sh compiles it statically into the scratch image reprieve.local/pause). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) {
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    printf("pause (reprieve)\n");
    return 0;
  }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not pid 1\n");
  struct sigaction term = {.sa_handler = on_term};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) pause();
}
