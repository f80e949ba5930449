#include <cstdio>

int main() {
  std::fprintf(stderr, "rill: the command line is being built\n");
  return 1;
}
