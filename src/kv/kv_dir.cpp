#include "kv/kv_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "kv/kv_file.h"

namespace rill {
namespace fs = std::filesystem;

namespace {
std::string lock_path(const std::string& dir) {
  return (fs::path(dir) / "LOCK").string();
}
}  // namespace

Result<KvDirLock> KvDirLock::acquire(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Error{dir + ": cannot create the cache directory: " + ec.message()};
  const std::string lock = lock_path(dir);
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Error{lock + ": cannot open: " + std::strerror(errno)};
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    return Error{dir + (err == EWOULDBLOCK ? std::string(": the cache directory is in use by another rill process")
                                           : std::string(": cannot lock: ") + std::strerror(err))};
  }
  return KvDirLock(fd);
}

KvDirLock& KvDirLock::operator=(KvDirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

KvDirLock::~KvDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

bool kv_dir_locked(const std::string& dir) {
  const int fd = ::open(lock_path(dir).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;  // no LOCK file: nobody ever owned it
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);  // drops the probe's shared lock, if it got one
  return held;
}

Result<std::vector<KvDirEntry>> list_kv_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Error{dir + ": not a directory"};
  std::vector<KvDirEntry> out;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    if (!name.ends_with(".rkv") || !de.is_regular_file(ec)) continue;
    KvDirEntry e;
    e.file = name;
    e.bytes = static_cast<uint64_t>(de.file_size(ec));
    auto header = read_kv_header(de.path().string());
    if (header.ok()) {
      e.tokens = static_cast<int64_t>(header->tokens.size());
      e.created_at = header->created_at;
    } else {
      e.error = header.error().message;
    }
    out.push_back(std::move(e));
  }
  if (ec) return Error{dir + ": cannot list: " + ec.message()};
  std::sort(out.begin(), out.end(), [](const KvDirEntry& a, const KvDirEntry& b) { return a.file < b.file; });
  return out;
}

Result<int64_t> clear_kv_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Error{dir + ": not a directory"};
  RILL_ASSIGN_OR_RETURN(KvDirLock lock, KvDirLock::acquire(dir));
  int64_t n = 0;
  for (const auto& de : fs::directory_iterator(dir, ec)) {
    const std::string name = de.path().filename().string();
    if (!name.ends_with(".rkv") && !name.ends_with(".tmp")) continue;
    std::error_code rm;
    if (fs::remove(de.path(), rm)) ++n;
    if (rm) return Error{de.path().string() + ": cannot remove: " + rm.message()};
  }
  if (ec) return Error{dir + ": cannot list: " + ec.message()};
  return n;
}

}  // namespace rill
