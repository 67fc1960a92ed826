// A freshly formatted namespace opened the way mount opens it, for tests of
// the modules below the filesystem core (journal, allocator, bmap, dir).
#pragma once

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "alloc/allocator.hpp"
#include "ctx/context.hpp"
#include "helpers.hpp"
#include "journal/journal.hpp"
#include "nvfs/media.hpp"
#include "nvfs/mkfs.hpp"
#include "nvfs/superblock.hpp"

namespace nvfs::test {

class FsFixture {
 public:
  // Formats a `size`-byte image with `block_size` blocks and opens it.
  explicit FsFixture(uint64_t size = 64ull << 20, uint32_t block_size = 4096,
                     uint64_t inodes = 0)
      : path_("fixture") {
    MkfsOptions options;
    options.block_size = block_size;
    options.inode_count = inodes;
    options.dir_hash_key = std::array<uint8_t, 16>{0x67, 0x45, 0x23, 0x01};
    MakeFile(path_.path(), size);
    Reopen([&](Media& media) {
      auto plan = PlanMkfs(media.size(), options);
      if (!plan.ok()) throw std::runtime_error(plan.error().message);
      if (!WriteMkfs(media, *plan).ok()) throw std::runtime_error("mkfs failed");
    });
  }

  // Drops the DRAM state and opens the namespace again, running journal
  // recovery (as a mount after a crash would). `before` runs on the media
  // first, if given.
  template <class Fn>
  void Reopen(Fn&& before) {
    ctx_.reset();
    alloc_.reset();
    journal_.reset();
    media_.reset();
    auto media = OpenMedia(path_.path(), MediaOptions{});
    if (!media.ok()) throw std::runtime_error(media.error().message);
    media_ = std::move(media.value());
    before(*media_);
    auto found = FindSuper(media_->base(), media_->size());
    if (!found.ok()) throw std::runtime_error(found.error().message);
    geometry_ = found->geometry;
    hash_key_ = NameHashKey::FromSuper(found->sb);
    journal_ = std::make_unique<Journal>(*media_, *geometry_);
    auto recovered = journal_->Recover();
    if (!recovered.ok()) throw std::runtime_error(recovered.error().message);
    last_recovery_ = recovered.value();
    alloc_ = std::make_unique<Allocator>(*media_, *geometry_);
    alloc_->Load();
    journal_->set_sink(alloc_.get());
    ctx_.emplace(FsContext{*media_, *geometry_, *alloc_, *journal_, hash_key_});
  }
  void Reopen() {
    Reopen([](Media&) {});
  }

  FsContext& ctx() { return *ctx_; }
  Media& media() { return *media_; }
  const Geometry& geometry() { return *geometry_; }
  Allocator& alloc() { return *alloc_; }
  Journal& journal() { return *journal_; }
  // The whole namespace as it is now.
  std::vector<std::byte> Snapshot() {
    return std::vector<std::byte>(media().base(), media().base() + media().size());
  }
  // Reopens as if the machine had crashed when `snapshot` was taken.
  void CrashTo(const std::vector<std::byte>& snapshot) {
    Reopen([&](Media& m) {
      m.Store(0, snapshot.data(), snapshot.size());
      m.Persist(0, snapshot.size());
    });
  }
  const Journal::RecoveryStats& last_recovery() const { return last_recovery_; }
  const std::string& path() const { return path_.path(); }

 private:
  TempPath path_;
  std::unique_ptr<Media> media_;
  std::optional<Geometry> geometry_;
  NameHashKey hash_key_;
  std::unique_ptr<Journal> journal_;
  std::unique_ptr<Allocator> alloc_;
  std::optional<FsContext> ctx_;
  Journal::RecoveryStats last_recovery_;
};

// A new, empty regular file (mode 0644, nothing mapped), made in its own
// transaction: the inode the bmap and xattr tests work on.
inline uint64_t CreateFile(FsFixture& fs) {
  Tx tx(fs.journal(), "create");
  auto ino = fs.alloc().AllocateInode(tx, 1, false);
  REQUIRE(ino.ok());
  const uint64_t at = fs.geometry().InodeOffset(*ino);
  tx.FillFresh(at, 0, sizeof(format::Inode));
  const uint16_t mode = S_IFREG | 0644;
  tx.StoreFresh(at + offsetof(format::Inode, mode), &mode, sizeof mode);
  REQUIRE(tx.Commit().ok());
  return *ino;
}

}  // namespace nvfs::test
