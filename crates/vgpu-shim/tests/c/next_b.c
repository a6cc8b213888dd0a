int probe(void) { return 2; }
