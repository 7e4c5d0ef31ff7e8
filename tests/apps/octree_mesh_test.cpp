// The octree proxy's mesh: every ghost slot of every leaf is filled exactly once (by one link
// or by the boundary), links pair up, and the serial reference is deterministic.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "tree.hpp"

namespace {

octree::Params small() {
  octree::Params p;
  p.n = 4;
  p.min_level = 1;
  p.max_level = 3;
  p.steps = 3;
  return p;
}

TEST(OctreeMesh, RefinesNearTheStarsOnly) {
  const octree::Mesh m(small());
  // Uniform at level 1 would be 8 leaves; refinement near two stars adds some, not all of 8³.
  EXPECT_GT(m.leaves(), 8u);
  EXPECT_LT(m.leaves(), 512u);
  EXPECT_EQ(m.max_level_present(), 3);
}

TEST(OctreeMesh, EveryGhostSlotIsFilledExactlyOnce) {
  for (int stars = 1; stars <= 2; ++stars) {
    octree::Params p = small();
    p.stars = stars;
    const octree::Mesh m(p);
    for (std::size_t a = 0; a < m.leaves(); ++a) {
      std::multiset<int> filled;
      for (const octree::Link& in : m.in_links(a)) {
        EXPECT_NE(in.peer, a);
        for (int s : in.slots) filled.insert(s);
      }
      for (const auto& [slot, cell] : m.mirrored(a)) {
        filled.insert(slot);
        EXPECT_GE(cell, 0);
        EXPECT_LT(cell, m.cells());
      }
      ASSERT_EQ(filled.size(), static_cast<std::size_t>(m.ghosts())) << "leaf " << a;
      EXPECT_EQ(std::set<int>(filled.begin(), filled.end()).size(), filled.size()) << "leaf " << a;
    }
  }
}

TEST(OctreeMesh, InAndOutLinksPairUp) {
  const octree::Mesh m(small());
  for (std::size_t a = 0; a < m.leaves(); ++a) {
    for (const octree::Link& in : m.in_links(a)) {
      bool found = false;
      for (const octree::Link& out : m.out_links(in.peer)) {
        if (out.peer != a) continue;
        found = true;
        EXPECT_EQ(out.cells.size(), in.slots.size());
        for (int c : out.cells) {
          EXPECT_GE(c, 0);
          EXPECT_LT(c, m.cells());
        }
      }
      EXPECT_TRUE(found) << "leaf " << in.peer << " has no link to " << a;
    }
  }
}

TEST(OctreeMesh, SerialReferenceIsDeterministicAndChanges) {
  octree::Params p = small();
  const octree::Mesh m(p);
  const octree::LeafSum a = octree::combine(octree::run_serial(m));
  const octree::LeafSum b = octree::combine(octree::run_serial(m));
  EXPECT_EQ(a.hash, b.hash);
  p.steps = 4;
  const octree::Mesh m4(p);
  EXPECT_NE(octree::combine(octree::run_serial(m4)).hash, a.hash);
}

TEST(OctreeMesh, BadParametersNameTheOption) {
  octree::Params p = small();
  p.n = 1;
  try {
    octree::check(p);
    FAIL() << "accepted --cells 1";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--cells 1"), std::string::npos) << e.what();
  }
  p = small();
  p.max_level = 0;
  EXPECT_THROW(octree::check(p), std::invalid_argument);
  p = small();
  p.min_level = 8;
  p.max_level = 8;
  try {
    const octree::Mesh m(p);
    FAIL() << "built " << m.leaves() << " leaves";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("leaves"), std::string::npos) << e.what();
  }
}

}  // namespace
