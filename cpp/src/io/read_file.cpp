// Whole-file reading, with gzip (the IOPDDL problem files are shipped compressed).
#include "io/read_file.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace autoshard {

std::string read_file_maybe_gzip(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error("'" + path + "' is a directory, not a file; pass the JSON file itself");
  std::ifstream probe(path, std::ios::binary);
  if (!probe) throw std::runtime_error("cannot open file '" + path + "': " + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  probe.read(reinterpret_cast<char*>(magic), 2);
  bool gz = probe.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
  probe.close();
  if (!gz) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw std::runtime_error("error while reading '" + path + "': " + std::strerror(errno));
    return ss.str();
  }
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open gzip file '" + path + "'");
  gzbuffer(f, 1 << 20);
  std::string out;
  std::vector<char> buf(1 << 20);
  while (true) {
    int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw std::runtime_error("'" + path + "' is not a valid gzip file: " + msg);
    }
    if (n == 0) break;
    out.append(buf.data(), static_cast<size_t>(n));
  }
  // gzread returns what it could decompress and stops quietly at a cut-off stream; zlib
  // records that as Z_BUF_ERROR, which would otherwise pass a partial file as whole.
  int err = Z_OK;
  std::string msg = gzerror(f, &err);
  gzclose(f);
  if (err != Z_OK)
    throw std::runtime_error("'" + path + "' is a truncated or damaged gzip file (" + msg + " after " +
                             std::to_string(out.size()) + " decompressed bytes); copy or download it again");
  return out;
}

}  // namespace autoshard
