// Whole-file reading, with gzip (the IOPDDL problem files are shipped compressed).
#include "io/read_file.h"

#include <zlib.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

namespace autoshard {

namespace {

// Whether `path` is gzip; throws for a directory or a file that cannot be opened.
bool is_gzip_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw std::runtime_error("'" + path + "' is a directory, not a file; pass the JSON file itself");
  std::ifstream probe(path, std::ios::binary);
  if (!probe) throw std::runtime_error("cannot open file '" + path + "': " + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  probe.read(reinterpret_cast<char*>(magic), 2);
  return probe.gcount() == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
}

// Reads up to `size` inflated bytes; 0 at the end. Throws on a damaged stream, and at the end
// of a cut-off one: gzread stops quietly there and zlib records Z_BUF_ERROR, which would
// otherwise pass a partial file as whole. `done` is the byte count so far, for the message.
size_t gz_read_chunk(gzFile f, const std::string& path, char* out, size_t size, size_t done) {
  const int n = gzread(f, out, static_cast<unsigned>(size));
  int err = Z_OK;
  if (n < 0) throw std::runtime_error("'" + path + "' is not a valid gzip file: " + gzerror(f, &err));
  if (n == 0) {
    const std::string msg = gzerror(f, &err);
    if (err != Z_OK)
      throw std::runtime_error("'" + path + "' is a truncated or damaged gzip file (" + msg + " after " +
                               std::to_string(done) + " decompressed bytes); copy or download it again");
  }
  return static_cast<size_t>(n);
}

// A stream buffer fed by a thread that inflates the file chunk by chunk, at most kAhead
// chunks ahead of the reader. An error of the inflating thread is rethrown by the read that
// reaches it.
class GzipPipe : public std::streambuf {
 public:
  explicit GzipPipe(const std::string& path) : path_(path) {
    file_ = gzopen(path.c_str(), "rb");
    if (!file_) throw std::runtime_error("cannot open gzip file '" + path + "'");
    gzbuffer(file_, 1 << 20);
    worker_ = std::thread([this] { inflate_all(); });
  }
  ~GzipPipe() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
    gzclose(file_);
  }

 protected:
  int_type underflow() override {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return !ready_.empty() || finished_; });
    if (ready_.empty()) {
      if (error_) std::rethrow_exception(error_);
      return traits_type::eof();
    }
    current_ = std::move(ready_.front());
    ready_.pop_front();
    changed_.notify_all();
    setg(current_.data(), current_.data(), current_.data() + current_.size());
    return traits_type::to_int_type(current_[0]);
  }

 private:
  static constexpr size_t kChunk = 4 << 20;
  static constexpr size_t kAhead = 2;

  void inflate_all() {
    size_t done = 0;
    try {
      while (true) {
        std::vector<char> chunk(kChunk);
        const size_t n = gz_read_chunk(file_, path_, chunk.data(), chunk.size(), done);
        if (n == 0) break;
        done += n;
        chunk.resize(n);
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [this] { return ready_.size() < kAhead || stop_; });
        if (stop_) return;
        ready_.push_back(std::move(chunk));
        changed_.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    changed_.notify_all();
  }

  const std::string path_;
  gzFile file_ = nullptr;
  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<std::vector<char>> ready_;
  std::vector<char> current_;
  std::exception_ptr error_;
  bool finished_ = false, stop_ = false;
  std::thread worker_;
};

// An istream that owns its buffer.
class PipeStream : public std::istream {
 public:
  explicit PipeStream(const std::string& path) : std::istream(nullptr), pipe_(path) { rdbuf(&pipe_); }

 private:
  GzipPipe pipe_;
};

}  // namespace

std::unique_ptr<std::istream> open_text_stream(const std::string& path) {
  if (!is_gzip_file(path)) {
    auto in = std::make_unique<std::ifstream>(path, std::ios::binary);
    if (!*in) throw std::runtime_error("cannot open file '" + path + "': " + std::strerror(errno));
    return in;
  }
  return std::make_unique<PipeStream>(path);
}

std::string read_file_maybe_gzip(const std::string& path) {
  if (!is_gzip_file(path)) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw std::runtime_error("error while reading '" + path + "': " + std::strerror(errno));
    return ss.str();
  }
  // The pipe's reads rethrow its inflating thread's errors (sgetn, unlike istream::read,
  // does not turn them into a failbit).
  GzipPipe pipe(path);
  std::string out;
  std::vector<char> buf(1 << 20);
  while (const std::streamsize n = pipe.sgetn(buf.data(), static_cast<std::streamsize>(buf.size())))
    out.append(buf.data(), static_cast<size_t>(n));
  return out;
}

}  // namespace autoshard
