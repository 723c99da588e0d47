// A small C++ job that reads its shard list and sums the shards, run to make real logs (see run_cpu.sh).
//   ./cpp_job missing   -- the shard list names a file that is not there: an exception nobody catches
//   ./cpp_job done      -- the shards are summed
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

static double sum_shard(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open shard " + path);
  double s = 0, v;
  while (in >> v) s += v;
  return s;
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "done";
  std::vector<std::string> shards = {"/etc/hostname", "/etc/hostname"};
  if (mode == "missing") shards.push_back("/data/shards/part-00002.txt");
  double total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    total += sum_shard(shards[i]);
    std::printf("shard %zu/%zu read\n", i + 1, shards.size());
    std::fflush(stdout);
  }
  std::printf("total %.1f\n", total);
  return 0;
}
