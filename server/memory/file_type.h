// FileTypeName: what kind of file a stat mode describes, for the messages of
// the descriptor mappers (host_fd_mapper, cuda_vmm_mapper) that refuse a
// descriptor of the wrong type.
#ifndef TOKENSEL_SERVER_MEMORY_FILE_TYPE_H_
#define TOKENSEL_SERVER_MEMORY_FILE_TYPE_H_

#include <sys/stat.h>

#include "absl/strings/string_view.h"

namespace tokensel::memory {

inline absl::string_view FileTypeName(mode_t mode) {
  if (S_ISREG(mode)) return "regular file";
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "pipe";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISLNK(mode)) return "symlink";
  return "file of unknown type";
}

}  // namespace tokensel::memory

#endif  // TOKENSEL_SERVER_MEMORY_FILE_TYPE_H_
