/* The benchmark floor: a static binary that does nothing. Whatever a plugin
 * costs above this is its own work; this much is process creation, exec and
 * the measuring loop. Built by run.sh: cc -O2 -static -o target/bench/noop */
int main(void) { return 0; }
