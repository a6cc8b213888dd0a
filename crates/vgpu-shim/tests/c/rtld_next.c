/* dlsym(RTLD_NEXT / RTLD_DEFAULT) keeps its meaning for callers other than the shim.
 * Linked: libnext_a (probe = 1, next_probe) before libnext_b (probe = 2). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int probe(void);
int next_probe(void);

#define CHECK(cond, ...) do { if (!(cond)) { printf("FAIL: %s: ", #cond); printf(__VA_ARGS__); printf("\n"); return 1; } } while (0)

int main(void) {
    for (int i = 0; i < 3; i++) {
        int v = next_probe();
        CHECK(v == 2, "RTLD_NEXT from libnext_a must find libnext_b's probe (lookup %d gave %d)", i, v);
    }
    int (*d)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "probe");
    CHECK(d && d() == 1, "RTLD_DEFAULT finds the first probe");
    int (*n)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    CHECK(n && n() == 1, "RTLD_NEXT from the program finds libnext_a's probe");
    dlerror();
    CHECK(dlsym(RTLD_NEXT, "no_such_symbol_anywhere") == NULL, "miss");
    CHECK(dlerror() != NULL, "a miss sets dlerror");
    void *self = dlopen(NULL, RTLD_NOW);
    CHECK(dlsym(self, "next_probe") == (void *)next_probe, "lookup through a handle");
    printf("ok rtld_next\n");
    return 0;
}
