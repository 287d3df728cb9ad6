#include "passes/merge_sibling_gemms.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "ir/node_predicates.h"
#include "ir/shape_inference.h"

namespace kiln {
namespace {

// A gemm's attributes, read once; nullopt for a gemm this pass never touches (batch > 1, an
// epilogue, FP8 slots, a second result).
struct GemmInfo {
  int64_t m = 0, n = 0, k = 0;
  std::string a_layout, b_layout;
  double alpha = 1, beta = 0;
};

std::optional<GemmInfo> InfoOf(const Node& g) {
  if (g.opcode() != Opcode::kGemm || HasFp8Slots(g) || g.has_multiple_results()) return std::nullopt;
  const AttrMap& a = g.attrs();
  absl::StatusOr<int64_t> batch = a.GetInt("batch"), m = a.GetInt("m"), n = a.GetInt("n"), k = a.GetInt("k");
  absl::StatusOr<std::string> al = a.GetSymbol("a_layout"), bl = a.GetSymbol("b_layout"), ep = a.GetSymbol("epilogue");
  absl::StatusOr<double> alpha = a.GetFloat("alpha"), beta = a.GetFloat("beta");
  if (!batch.ok() || !m.ok() || !n.ok() || !k.ok() || !al.ok() || !bl.ok() || !ep.ok() || !alpha.ok() || !beta.ok()) {
    return std::nullopt;
  }
  if (*batch != 1 || *ep != "none") return std::nullopt;
  if (g.num_operands() != (*beta != 0.0 ? 3 : 2)) return std::nullopt;
  return GemmInfo{*m, *n, *k, *al, *bl, *alpha, *beta};
}

// Worth merging (merge_sibling_gemms.h): small enough that its fixed costs matter.
bool SmallEnough(const GemmInfo& g) {
  const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
  return flops <= static_cast<double>(kMaxMergedPieceFlops);
}

// The dim along which operands laid out as [first, second] join along `first` (their bytes
// one after another: every dim but dim 0 equal) or along `second` (the last dim, which must
// be exactly that size, every other dim equal). nullopt when the shapes do not allow it.
std::optional<int64_t> JoinDim(const std::vector<Node*>& xs, bool along_first, const std::vector<int64_t>& sizes) {
  const TensorType& t0 = xs[0]->type();
  if (t0.rank() < 1) return std::nullopt;
  const int64_t dim = along_first ? 0 : t0.rank() - 1;
  for (size_t i = 0; i < xs.size(); ++i) {
    const TensorType& t = xs[i]->type();
    if (t.dtype != t0.dtype || t.rank() != t0.rank()) return std::nullopt;
    for (int64_t d = 0; d < t.rank(); ++d) {
      if (d != dim && t.dims[d] != t0.dims[d]) return std::nullopt;
    }
    if (!along_first && t.dims[dim] != sizes[i]) return std::nullopt;
  }
  return dim;
}

// Definition order, for placing new nodes and ordering pieces.
absl::flat_hash_map<const Node*, int64_t> Positions(const Function& f) {
  absl::flat_hash_map<const Node*, int64_t> pos;
  for (size_t i = 0; i < f.nodes().size(); ++i) pos[f.nodes()[i].get()] = static_cast<int64_t>(i);
  return pos;
}

// The node just after the last of `xs` in definition order (a new node that reads them all
// goes before it).
Node* AfterLastOf(const Function& f, const std::vector<Node*>& xs) {
  const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f);
  int64_t last = -1;
  for (const Node* x : xs) last = std::max(last, pos.at(x));
  return f.nodes()[last + 1].get();
}

class Merger {
 public:
  explicit Merger(Function& f) : f_(f) {}

  bool Run() {
    bool changed = false;
    // Shared a first (the forward's projections make the concatenated weights), then the
    // chains (whose b concatenates are then those very nodes), then shared b (whose
    // concatenated gradients the chains have made).
    changed |= MergeShared(/*shared_a=*/true);
    changed |= MergeChains();
    changed |= MergeShared(/*shared_a=*/false);
    return changed;
  }

 private:
  // concatenate(xs) {dim}, made once: the same operands in the same order along the same dim
  // give the node made before. Placed right after its last operand.
  Node* Concatenate(const std::vector<Node*>& xs, int64_t dim) {
    auto key = std::make_pair(xs, dim);
    if (auto it = concats_.find(key); it != concats_.end()) return it->second;
    AttrMap attrs{{"dim", dim}};
    std::vector<TensorType> types;
    for (const Node* x : xs) types.push_back(x->type());
    absl::StatusOr<TensorType> type = InferResultType(Opcode::kConcatenate, types, attrs, /*declared=*/nullptr);
    if (!type.ok()) return nullptr;
    Node* c = f_.InsertNodeBefore(AfterLastOf(f_, xs), Opcode::kConcatenate, xs, std::move(attrs), *type,
                                  f_.UniqueName(absl::StrCat(xs[0]->name(), ".concat")), xs[0]->scope());
    concats_[key] = c;
    return c;
  }

  // The order of an earlier concatenate of the same operands along `dim`, if there is one,
  // so that pieces ordered otherwise (by their a, not their weight) still share it.
  std::optional<std::vector<Node*>> KnownOrder(std::vector<Node*> xs, int64_t dim) const {
    std::sort(xs.begin(), xs.end(), [](const Node* a, const Node* b) { return a->id() < b->id(); });
    for (const auto& [key, node] : concats_) {
      if (key.second != dim || key.first.size() != xs.size()) continue;
      std::vector<Node*> sorted = key.first;
      std::sort(sorted.begin(), sorted.end(), [](const Node* a, const Node* b) { return a->id() < b->id(); });
      if (sorted == xs) return key.first;
    }
    return std::nullopt;
  }

  // Replaces pieces (in the order their results lie in `merged`'s, joined along `dim` of the
  // result) by slices of `merged`; each slice takes its piece's name.
  void SliceBack(Node* merged, const std::vector<Node*>& pieces, int64_t dim) {
    Node* last = merged;
    int64_t offset = 0;
    const TensorType& whole = merged->type();
    for (Node* piece : pieces) {
      std::vector<int64_t> start(whole.rank(), 0), limit = whole.dims, stride(whole.rank(), 1);
      start[dim] = offset;
      limit[dim] = offset + piece->type().dims[dim];
      offset = limit[dim];
      const std::string name = piece->name();
      Node* s = f_.InsertNodeBefore(AfterLastOf(f_, {last}), Opcode::kSlice, {merged},
                                    AttrMap{{"start", start}, {"limit", limit}, {"stride", stride}}, piece->type(),
                                    f_.UniqueName(absl::StrCat(name, ".slice")), piece->scope());
      piece->ReplaceAllUsesWith(s);  // outputs included
      f_.RemoveNode(piece);
      f_.RenameNode(s, name);
      last = s;
    }
  }

  // Whether every user of every piece comes after `at` (where the merged gemm will be).
  bool UsersAfter(const std::vector<Node*>& pieces, const Node* at) const {
    const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f_);
    for (const Node* p : pieces) {
      for (const Node* u : p->users()) {
        if (pos.at(u) < pos.at(at)) return false;
      }
    }
    return true;
  }

  // Whether `x` is defined before `before`, or can be moved there with the nodes it is
  // computed from that are not (kMaxHoistDepth levels at most; never parameters, multi-result
  // groups or fusions).
  static constexpr int kMaxHoistDepth = 3;
  bool CanHoist(const Node* x, const Node* before, int depth) const {
    const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f_);
    if (pos.at(x) < pos.at(before)) return true;
    if (depth >= kMaxHoistDepth || x->opcode() == Opcode::kParameter || x->opcode() == Opcode::kGetResult ||
        x->has_multiple_results() || x->body() != nullptr || x == before) {
      return false;
    }
    for (const Node* o : x->operands()) {
      if (!CanHoist(o, before, depth + 1)) return false;
    }
    return true;
  }
  void Hoist(Node* x, Node* before) {
    const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f_);
    if (pos.at(x) < pos.at(before)) return;
    for (Node* o : x->operands()) Hoist(o, before);
    f_.MoveNodeBefore(x, before);
  }

  // Shared a (pieces differ in b: merged along N) or shared b (differ in a: merged along M).
  bool MergeShared(bool shared_a) {
    using Key = std::tuple<const Node*, std::string, std::string, int64_t, double, DType>;
    std::map<Key, std::vector<Node*>> groups;
    std::vector<Key> order;
    for (const auto& n : f_.nodes()) {
      std::optional<GemmInfo> g = InfoOf(*n);
      if (!g || g->beta != 0.0 || !SmallEnough(*g)) continue;
      Key key{n->operand(shared_a ? 0 : 1), g->a_layout, g->b_layout, g->k, g->alpha, n->type().dtype};
      auto [it, fresh] = groups.try_emplace(key);
      if (fresh) order.push_back(key);
      it->second.push_back(n.get());
    }
    bool changed = false;
    for (const Key& key : order) {
      std::vector<Node*>& pieces = groups[key];
      if (pieces.size() >= 2) changed |= MergeGroup(pieces, shared_a);
    }
    return changed;
  }

  bool MergeGroup(std::vector<Node*> pieces, bool shared_a) {
    const int side = shared_a ? 1 : 0;  // the operand the pieces differ in
    const GemmInfo info = *InfoOf(*pieces[0]);
    const std::string& layout = shared_a ? info.b_layout : info.a_layout;
    const bool free_first = layout == (shared_a ? "nk" : "mk");
    {  // pieces in the order their differing operands are defined (weights: the model's order)
      const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f_);
      std::stable_sort(pieces.begin(), pieces.end(),
                       [&](const Node* x, const Node* y) { return pos.at(x->operand(side)) < pos.at(y->operand(side)); });
    }
    auto operands_of = [&] {
      std::vector<Node*> xs;
      for (Node* p : pieces) xs.push_back(p->operand(side));
      return xs;
    };
    std::vector<Node*> xs = operands_of();
    // The same operand twice is a duplicate GEMM (cse's), not a sibling.
    if (absl::flat_hash_set<Node*>(xs.begin(), xs.end()).size() != xs.size()) return false;
    if (std::optional<std::vector<Node*>> known = KnownOrder(xs, free_first ? 0 : xs[0]->type().rank() - 1)) {
      std::vector<Node*> reordered;
      for (Node* x : *known) {
        for (Node* p : pieces) {
          if (p->operand(side) == x) reordered.push_back(p);
        }
      }
      pieces = std::move(reordered);
      xs = operands_of();
    }
    std::vector<int64_t> free_sizes;  // N_i (shared a) or M_i (shared b)
    for (Node* p : pieces) free_sizes.push_back(shared_a ? InfoOf(*p)->n : InfoOf(*p)->m);
    std::optional<int64_t> operand_dim = JoinDim(xs, free_first, free_sizes);
    // D is [M, N] row-major: pieces of N join along its last dim, pieces of M along its first.
    std::optional<int64_t> result_dim = JoinDim(pieces, /*along_first=*/!shared_a, free_sizes);
    if (!operand_dim || !result_dim) return false;

    int64_t total = 0;
    for (int64_t s : free_sizes) total += s;
    TensorType merged_type = pieces[0]->type();
    merged_type.dims[*result_dim] = 0;
    for (Node* p : pieces) merged_type.dims[*result_dim] += p->type().dims[*result_dim];

    // The merged gemm goes after every piece's operands and the concatenate; it must still
    // come before every use of a piece. Where it would not (the frontend converts each
    // weight just before its GEMM, and q's reshape follows q's GEMM before k's weight is
    // converted), the operands defined after the first piece move up to just before it
    // (with what they are computed from, a few nodes at most), if they can.
    Node* shared = pieces[0]->operand(1 - side);
    std::vector<Node*> all_operands = xs;
    all_operands.push_back(shared);
    if (!UsersAfter(pieces, AfterLastOf(f_, all_operands))) {
      Node* first = pieces[0];
      const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f_);
      for (Node* p : pieces) {
        if (pos.at(p) < pos.at(first)) first = p;
      }
      for (Node* x : xs) {
        if (!CanHoist(x, first, 0)) return false;
      }
      // Now every operand, hence the merged gemm, comes before the first piece, and every
      // use of a piece after it.
      for (Node* x : xs) Hoist(x, first);
    }
    Node* joined = Concatenate(xs, *operand_dim);
    if (joined == nullptr) return false;
    AttrMap attrs = pieces[0]->attrs();
    attrs.Set(shared_a ? "n" : "m", total);
    std::vector<Node*> operands = shared_a ? std::vector<Node*>{pieces[0]->operand(0), joined}
                                           : std::vector<Node*>{joined, pieces[0]->operand(1)};
    Node* place = AfterLastOf(f_, operands);
    Node* merged = f_.InsertNodeBefore(place, Opcode::kGemm, std::move(operands), std::move(attrs),
                                       merged_type, f_.UniqueName(absl::StrCat(pieces[0]->name(), ".merged")),
                                       pieces[0]->scope());
    SliceBack(merged, pieces, *result_dim);
    return true;
  }

  // A link that may continue a chain whose next-outer link is described by `outer`: same M,
  // N, layouts, alpha, operand and result types; read once, by that link, as its C.
  static bool SameChain(const GemmInfo& x, const GemmInfo& outer) {
    return x.m == outer.m && x.n == outer.n && x.a_layout == outer.a_layout && x.b_layout == outer.b_layout &&
           x.alpha == outer.alpha;
  }

  // The chain whose outermost link is `top`, outermost first; empty if `top` heads none.
  std::vector<Node*> ChainFrom(Node* top) const {
    std::optional<GemmInfo> t = InfoOf(*top);
    if (!t || t->a_layout != "mk" || !SmallEnough(*t)) return {};
    std::vector<Node*> chain = {top};
    Node* link = top;
    for (std::optional<GemmInfo> l = t; l && l->beta == 1.0;) {
      Node* inner = link->operand(2);
      std::optional<GemmInfo> i = InfoOf(*inner);
      if (!i || !SameChain(*i, *t) || !SmallEnough(*i) || inner->users().size() != 1 || IsFunctionOutput(*inner) ||
          inner->type() != top->type() || inner->operand(0)->type().dtype != top->operand(0)->type().dtype) {
        break;
      }
      chain.push_back(inner);
      link = inner;
      l = i;
    }
    return chain.size() >= 2 ? chain : std::vector<Node*>{};
  }

  // Whether `n` is a link inside a longer chain (its one user takes it as C).
  bool IsInnerLink(const Node& n) const {
    if (n.users().size() != 1 || IsFunctionOutput(n)) return false;
    const Node* user = n.users()[0];
    std::optional<GemmInfo> u = InfoOf(*user);
    std::optional<GemmInfo> self = InfoOf(n);
    return u && self && u->beta == 1.0 && user->operand(2) == &n && u->a_layout == "mk" && SameChain(*self, *u) &&
           SmallEnough(*u) && SmallEnough(*self) && user->type() == n.type() &&
           user->operand(0)->type().dtype == n.operand(0)->type().dtype;
  }

  bool MergeChains() {
    std::vector<Node*> tops;
    for (const auto& n : f_.nodes()) {
      if (n->opcode() == Opcode::kGemm && !IsInnerLink(*n)) tops.push_back(n.get());
    }
    bool changed = false;
    for (Node* top : tops) {
      std::vector<Node*> chain = ChainFrom(top);
      if (!chain.empty()) changed |= MergeChain(chain);
    }
    return changed;
  }

  bool MergeChain(const std::vector<Node*>& chain) {
    Node* top = chain.front();
    Node* innermost = chain.back();
    const GemmInfo inner_info = *InfoOf(*innermost);
    const bool b_k_first = InfoOf(*top)->b_layout == "kn";
    // Pieces ordered by where their b (the weight) is defined, as the forward's are.
    std::vector<Node*> links = chain;
    {
      const absl::flat_hash_map<const Node*, int64_t> pos = Positions(f_);
      std::stable_sort(links.begin(), links.end(),
                       [&](const Node* x, const Node* y) { return pos.at(x->operand(1)) < pos.at(y->operand(1)); });
    }
    std::vector<Node*> gs, bs;
    std::vector<int64_t> ks;
    for (Node* l : links) {
      gs.push_back(l->operand(0));
      bs.push_back(l->operand(1));
      ks.push_back(InfoOf(*l)->k);
    }
    std::optional<int64_t> g_dim = JoinDim(gs, /*along_first=*/false, ks);  // a mk: [M, K_i]
    std::optional<int64_t> b_dim = JoinDim(bs, b_k_first, ks);              // b kn: [K_i, N]; nk: [N, K_i]
    if (!g_dim || !b_dim) return false;
    Node* g = Concatenate(gs, *g_dim);
    Node* b = Concatenate(bs, *b_dim);
    if (g == nullptr || b == nullptr) return false;
    int64_t total = 0;
    for (int64_t k : ks) total += k;
    AttrMap attrs = top->attrs();
    attrs.Set("k", total);
    attrs.Set("beta", inner_info.beta);
    std::vector<Node*> operands = {g, b};
    if (inner_info.beta != 0.0) operands.push_back(innermost->operand(2));
    const std::string name = top->name();
    Node* place = AfterLastOf(f_, operands);
    Node* merged = f_.InsertNodeBefore(place, Opcode::kGemm, std::move(operands), std::move(attrs),
                                       top->type(), f_.UniqueName(absl::StrCat(name, ".merged")), top->scope());
    top->ReplaceAllUsesWith(merged);
    for (Node* l : chain) f_.RemoveNode(l);  // outermost first: each is unused once its user is gone
    f_.RenameNode(merged, name);
    return true;
  }

  Function& f_;
  std::map<std::pair<std::vector<Node*>, int64_t>, Node*> concats_;
};

}  // namespace

absl::StatusOr<bool> MergeSiblingGemmsPass::RunOnFunction(Function& f) { return Merger(f).Run(); }

}  // namespace kiln
