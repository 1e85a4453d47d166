/* slow_dns.c: slow_dns.so, LD_PRELOAD'd into a worker by faults:slow_dns_no_stall and into psd
 * by faults:signal_before_serving. While the file named by SLOW_DNS_FILE exists, every
 * getaddrinfo first sleeps SLOW_DNS_MS (default 3000): a resolver whose DNS server does not
 * answer; with SLOW_DNS_MARK set, it first creates that file (the caller is in a lookup now).
 * Test code, not part of psd. */
#include <fcntl.h>
#include <dlfcn.h>
#include <netdb.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*gai_fn)(const char *, const char *, const struct addrinfo *, struct addrinfo **);

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    gai_fn real = (gai_fn)dlsym(RTLD_NEXT, "getaddrinfo");
    const char *file = getenv("SLOW_DNS_FILE"), *ms = getenv("SLOW_DNS_MS");
    const char *mark = getenv("SLOW_DNS_MARK");
    if (file && access(file, F_OK) == 0) {
        int fd = mark ? open(mark, O_WRONLY | O_CREAT, 0600) : -1;
        if (fd >= 0) close(fd);
        long t = ms ? atol(ms) : 3000;
        struct timespec ts = {t / 1000, (t % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    return real ? real(node, service, hints, res) : EAI_FAIL;
}
