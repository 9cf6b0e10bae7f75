// The shared segment of ShmCommunicator (shm_segment.h).
#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <fmt/format.h>
#include <torch/torch.h>

namespace zeroplan::exec::shm {
namespace {

std::string random_name() {
  std::random_device rd;
  return fmt::format("/zeroplan-{:08x}{:08x}", rd(), rd());
}

}  // namespace

char* open_segment(Communicator& base, std::size_t bytes, std::vector<pid_t>& pids, std::string& why) {
  const int rank = base.rank(), world = base.world_size();
  torch::Tensor name = torch::zeros({static_cast<std::int64_t>(kNameBytes)}, torch::kUInt8);
  int fd = -1;
  std::string path;
  if (rank == 0) {
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      path = random_name();
      fd = shm_open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    }
    if (fd < 0) {
      why = fmt::format("cannot create a segment: {}", std::strerror(errno));
    } else if (const int err = ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
               err != 0) {
      why = fmt::format("cannot reserve {} bytes in /dev/shm: {}", bytes, std::strerror(err));
      close(fd);
      fd = -1;
      shm_unlink(path.c_str());
    } else {
      std::memcpy(name.data_ptr(), path.data(), path.size());
    }
  }
  base.broadcast(name, 0)->wait();
  torch::Tensor pid = torch::full({1}, static_cast<std::int64_t>(getpid()), torch::kInt64);
  torch::Tensor all = torch::empty({world}, torch::kInt64);
  base.all_gather(all, pid)->wait();
  for (int q = 0; q < world; ++q) pids.push_back(static_cast<pid_t>(all[q].item<std::int64_t>()));
  path.assign(static_cast<const char*>(name.data_ptr()), strnlen(static_cast<const char*>(name.data_ptr()), kNameBytes));
  void* addr = MAP_FAILED;
  if (!path.empty()) {
    if (rank != 0) fd = shm_open(path.c_str(), O_RDWR, 0600);
    if (fd < 0) {
      why = fmt::format("rank {} cannot open {}: {}", rank, path, std::strerror(errno));
    } else {
      addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (addr == MAP_FAILED) why = fmt::format("rank {} cannot map {} bytes: {}", rank, bytes, std::strerror(errno));
      close(fd);
    }
  }
  torch::Tensor mapped = torch::full({1}, addr == MAP_FAILED ? 0 : 1, torch::kInt64);
  base.all_reduce(mapped, ReduceOp::kSum)->wait();
  if (rank == 0 && !path.empty()) shm_unlink(path.c_str());
  if (mapped.item<std::int64_t>() == world) return static_cast<char*>(addr);
  if (addr != MAP_FAILED) munmap(addr, bytes);
  return nullptr;
}


}  // namespace zeroplan::exec::shm
