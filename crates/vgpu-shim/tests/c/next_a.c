/* Defines probe() and looks up the *next* probe(), as LLVM OpenMP looks up ompt_start_tool. */
#define _GNU_SOURCE
#include <dlfcn.h>
int probe(void) { return 1; }
int next_probe(void) {
    int (*f)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    return f ? f() : -1;
}
