// The DFlash draft's batched forward (every block of a packed batch in one
// masked attention) against a plain formulation written here: one block at
// a time, its keys exactly the context rows of its sample before its
// anchor and its own rows, no mask. fp64 on the CPU, forward and backward.
#include "student_trainer/draft/dflash_draft.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/base/file_util.h"
#include "common/model/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "student_trainer/feed/eval_batch.h"
#include "tests/scratch_dir.h"

namespace e3 {
namespace {

const auto kDFlashF64 = torch::TensorOptions().dtype(torch::kDouble);

DFlashDraftConfig TinyDFlashConfig() {
  DFlashDraftConfig c;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.vocab_size = 40;
  c.block_size = 4;
  c.mask_token_id = 39;
  c.target_layer_ids = {1, 3};
  return c;
}

at::Tensor PlainNorm(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x * torch::rsqrt(x.pow(2).mean(-1, true) + eps));
}

at::Tensor PlainRope(const at::Tensor& x, const std::vector<int64_t>& positions, double theta) {
  // x [rows, heads, D]: rotate-half rope at each row's position, its
  // tables in fp32 as transformers makes them (Qwen3RotaryEmbedding).
  const int64_t D = x.size(2);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  at::Tensor inv = 1.0 / torch::pow(theta, torch::arange(0, D, 2, f32) / static_cast<float>(D));
  at::Tensor pos = torch::tensor(positions, torch::kLong).to(torch::kFloat).unsqueeze(1);
  at::Tensor freqs = torch::cat({pos * inv, pos * inv}, 1);  // [rows, D]
  at::Tensor cos = freqs.cos().to(torch::kDouble).unsqueeze(1), sin = freqs.sin().to(torch::kDouble).unsqueeze(1);
  at::Tensor rotated = torch::cat({-x.narrow(2, D / 2, D / 2), x.narrow(2, 0, D / 2)}, 2);
  return x * cos + rotated * sin;
}

// One block alone: `context` [n, H] are the projected context rows it may
// see (positions 0..n-1), `embeds` [B, H] its rows at positions n..n+B-1.
at::Tensor PlainDFlashBlock(DFlashDraftImpl& d, const at::Tensor& context, const at::Tensor& embeds) {
  const DFlashDraftConfig& c = d.config();
  const int64_t n = context.size(0), B = embeds.size(0), D = c.head_dim;
  std::vector<int64_t> ctx_pos, blk_pos;
  for (int64_t i = 0; i < n; ++i) ctx_pos.push_back(i);
  for (int64_t i = 0; i < B; ++i) blk_pos.push_back(n + i);
  const int64_t group = c.num_heads / c.num_kv_heads;
  at::Tensor x = embeds;
  for (auto& l : d.layers) {
    at::Tensor h = PlainNorm(x, l.input_layernorm, c.rms_norm_eps);
    at::Tensor q = PlainRope(PlainNorm(l.q_proj->forward(h).view({B, c.num_heads, D}), l.q_norm, c.rms_norm_eps), blk_pos, c.rope.theta);
    at::Tensor keys = torch::cat({l.k_proj->forward(context), l.k_proj->forward(h)}, 0).view({n + B, c.num_kv_heads, D});
    std::vector<int64_t> key_pos = ctx_pos;
    key_pos.insert(key_pos.end(), blk_pos.begin(), blk_pos.end());
    keys = PlainRope(PlainNorm(keys, l.k_norm, c.rms_norm_eps), key_pos, c.rope.theta);
    at::Tensor values = torch::cat({l.v_proj->forward(context), l.v_proj->forward(h)}, 0).view({n + B, c.num_kv_heads, D});
    std::vector<at::Tensor> heads;
    for (int64_t head = 0; head < c.num_heads; ++head) {
      at::Tensor kh = keys.select(1, head / group), vh = values.select(1, head / group);
      at::Tensor p = torch::softmax(torch::matmul(q.select(1, head), kh.t()) / std::sqrt(double(D)), -1);
      heads.push_back(torch::matmul(p, vh));
    }
    x = x + l.o_proj->forward(torch::cat(heads, 1));
    at::Tensor m = PlainNorm(x, l.post_attention_layernorm, c.rms_norm_eps);
    x = x + l.down_proj->forward(torch::silu(l.gate_proj->forward(m)) * l.up_proj->forward(m));
  }
  return PlainNorm(x, d.norm, c.rms_norm_eps);
}

struct DFlashBatch {
  DFlashBlocks blocks;
  at::Tensor target_hidden;  // [T, k * H]
  at::Tensor block_embeds;   // [nB * B, H]
};

// Two samples, 7 and 9 rows; anchors at their first row, inside, and next
// to the boundary.
DFlashBatch MakeDFlashBatch(const DFlashDraftConfig& c) {
  DFlashBatch b;
  b.blocks.cu_seqlens = {0, 7, 16};
  b.blocks.anchor_rows = {0, 3, 6, 7, 10, 15};
  const int64_t k = static_cast<int64_t>(c.target_layer_ids.size());
  b.target_hidden = torch::randn({16, k * c.hidden_size}, kDFlashF64);
  b.block_embeds = torch::randn({6 * c.block_size, c.hidden_size}, kDFlashF64);
  return b;
}

// Every block through PlainBlock, concatenated in block order.
at::Tensor PlainDFlashForward(DFlashDraftImpl& d, const DFlashBatch& b) {
  const at::Tensor context = d.ProjectContext(b.target_hidden);
  const int64_t B = d.config().block_size;
  std::vector<at::Tensor> out;
  size_t s = 0;
  for (size_t i = 0; i < b.blocks.anchor_rows.size(); ++i) {
    const int64_t anchor = b.blocks.anchor_rows[i];
    while (anchor >= b.blocks.cu_seqlens[s + 1]) ++s;
    const int64_t start = b.blocks.cu_seqlens[s];
    out.push_back(PlainDFlashBlock(d, context.narrow(0, start, anchor - start),
                             b.block_embeds.narrow(0, static_cast<int64_t>(i) * B, B)));
  }
  return torch::cat(out, 0);
}

TEST(DFlashDraftTest, AMaskTokenOutsideTheEmbeddingIsRefused) {
  DFlashDraftConfig c = TinyDFlashConfig();
  c.mask_token_id = c.vocab_size;
  const absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("mask_token_id 40 lies outside the target's embedding [0, 40)"), std::string::npos) << s;
  c.mask_token_id = 3;
  c.block_size = 1;
  EXPECT_NE(c.Validate().message().find("block_size 1"), std::string::npos);
}

TEST(DFlashDraftTest, ExportNamesAreTheServingEnginesOnes) {
  auto d = CreateDFlashDraft(TinyDFlashConfig(), kDFlashF64, 1);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<std::string> names;
  for (const auto& p : (*d)->named_parameters()) names.push_back(p.key());
  for (const char* want : {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.input_layernorm.weight",
                           "layers.1.self_attn.q_proj.weight", "layers.1.self_attn.k_norm.weight",
                           "layers.0.self_attn.q_norm.weight", "layers.1.mlp.down_proj.weight",
                           "layers.0.post_attention_layernorm.weight"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  EXPECT_EQ(names.size(), 3u + 2u * 11u);  // fc, two norms; per layer 7 projections and 4 norms
}

TEST(DFlashDraftTest, EqualSeedsGiveEqualWeightsInOneFlatBuffer) {
  auto a = CreateDFlashDraft(TinyDFlashConfig(), kDFlashF64, 21), b = CreateDFlashDraft(TinyDFlashConfig(), kDFlashF64, 21);
  auto other = CreateDFlashDraft(TinyDFlashConfig(), kDFlashF64, 22);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  EXPECT_TRUE(torch::equal((*a)->flat().data(), (*b)->flat().data()));
  EXPECT_FALSE(torch::equal((*a)->flat().data(), (*other)->flat().data()));
  int64_t total = 0;
  for (const auto& [name, p] : (*a)->ExportedParameters()) total += p.numel();
  EXPECT_EQ((*a)->flat().numel(), total);
  // The parameters are views of the buffer: the fused optimizer's update
  // of the buffer is the modules' update.
  torch::NoGradGuard no_grad;
  (*a)->flat().data().fill_(0.5);
  EXPECT_EQ((*a)->layers[1].q_proj->weight.max().item<double>(), 0.5);
  EXPECT_EQ((*a)->norm.min().item<double>(), 0.5);
}

TEST(DFlashDraftTest, TheBatchedForwardIsEachBlockAlone) {
  torch::manual_seed(3);
  auto d = CreateDFlashDraft(TinyDFlashConfig(), kDFlashF64, 7);
  ASSERT_TRUE(d.ok()) << d.status();
  const DFlashBatch b = MakeDFlashBatch((*d)->config());
  const at::Tensor plain = PlainDFlashForward(**d, b);
  for (DFlashKernels kind : {DFlashKernels::kReference, DFlashKernels::kFast}) {
    SCOPED_TRACE(static_cast<int>(kind));
    (*d)->set_kernels(kind);
    const at::Tensor batched = (*d)->Forward(b.block_embeds, (*d)->ProjectContext(b.target_hidden), b.blocks);
    ASSERT_EQ(batched.sizes(), plain.sizes());
    EXPECT_LT((batched - plain).abs().max().item<double>(), 1e-12);
  }
}

TEST(DFlashDraftTest, ABlockSeesOnlyItsSamplesRowsBeforeItsAnchor) {
  torch::manual_seed(4);
  auto d = CreateDFlashDraft(TinyDFlashConfig(), kDFlashF64, 8);
  ASSERT_TRUE(d.ok());
  DFlashBatch b = MakeDFlashBatch((*d)->config());
  const at::Tensor before = (*d)->Forward(b.block_embeds, (*d)->ProjectContext(b.target_hidden), b.blocks);
  // Row 5 is in sample 0: the block anchored at 6 sees it; the one at 3
  // does not (it is after the anchor), nor do sample 1's blocks.
  b.target_hidden[5] += 1.0;
  const at::Tensor after = (*d)->Forward(b.block_embeds, (*d)->ProjectContext(b.target_hidden), b.blocks);
  const int64_t B = (*d)->config().block_size;
  auto changed = [&](int64_t block) {
    return (before.narrow(0, block * B, B) - after.narrow(0, block * B, B)).abs().max().item<double>() > 0;
  };
  EXPECT_FALSE(changed(0));
  EXPECT_FALSE(changed(1));
  EXPECT_TRUE(changed(2));
  for (int64_t block = 3; block < 6; ++block) EXPECT_FALSE(changed(block)) << block;
  // Its own anchor row is not context either: the target has not run it.
  b.target_hidden[10] += 1.0;
  const at::Tensor again = (*d)->Forward(b.block_embeds, (*d)->ProjectContext(b.target_hidden), b.blocks);
  EXPECT_EQ((again.narrow(0, 4 * B, B) - after.narrow(0, 4 * B, B)).abs().max().item<double>(), 0.0);
  EXPECT_GT((again.narrow(0, 5 * B, B) - after.narrow(0, 5 * B, B)).abs().max().item<double>(), 0.0);
}

TEST(DFlashDraftTest, GradientsOfTheBlockLossEqualThePlainFormulations) {
  torch::manual_seed(5);
  auto d = CreateDFlashDraft(TinyDFlashConfig(), kDFlashF64, 9);
  ASSERT_TRUE(d.ok());
  const DFlashDraftConfig& c = (*d)->config();
  const DFlashBatch b = MakeDFlashBatch(c);
  const at::Tensor head = torch::randn({c.vocab_size, c.hidden_size}, kDFlashF64) * 0.3;
  at::Tensor labels = torch::randint(0, c.vocab_size, {6 * c.block_size}, torch::kLong);
  labels[9] = -1;  // past a sample's end
  auto grads = [&](const at::Tensor& hidden) {
    (*d)->zero_grad();
    const at::Tensor loss = DFlashBlockLoss(torch::matmul(hidden, head.t()), labels, c.block_size, 7.0);
    loss.backward();
    std::vector<at::Tensor> g;
    for (const auto& p : (*d)->parameters()) g.push_back(p.grad().clone());
    return std::make_pair(loss.item<double>(), g);
  };
  const auto [plain_loss, plain] = grads(PlainDFlashForward(**d, b));
  for (DFlashKernels kind : {DFlashKernels::kReference, DFlashKernels::kFast}) {
    SCOPED_TRACE(static_cast<int>(kind));
    (*d)->set_kernels(kind);
    const auto [batched_loss, batched] =
        grads((*d)->Forward(b.block_embeds, (*d)->ProjectContext(b.target_hidden), b.blocks));
    EXPECT_NEAR(batched_loss, plain_loss, 1e-12);
    ASSERT_EQ(batched.size(), plain.size());
    for (size_t i = 0; i < batched.size(); ++i) {
      EXPECT_LT((batched[i] - plain[i]).abs().max().item<double>(), 1e-12) << i;
      EXPECT_GT(batched[i].abs().max().item<double>(), 0.0) << "parameter " << i << " gets no gradient";
    }
  }
}

TEST(DFlashDraftTest, TheBlockLossWeighsDraftedRowsByDistance) {
  // One block of 4: row 0 is the anchor (no loss), rows 1..3 weigh 1,
  // e^(-1/2), e^(-1) at gamma 2; a negative label drops its row.
  const at::Tensor logits = torch::randn({4, 5}, kDFlashF64);
  const at::Tensor labels = torch::tensor({2, 1, -1, 4}, torch::kLong);
  const at::Tensor nll = -torch::log_softmax(logits, -1);
  const double w1 = 1.0, w3 = std::exp(-1.0);
  const double want = (w1 * nll[1][1].item<double>() + w3 * nll[3][4].item<double>()) / (w1 + w3);
  EXPECT_NEAR(DFlashBlockLoss(logits, labels, 4, 2.0).item<double>(), want, 1e-12);
}

// D-PACE against its definition written out row by row: two blocks of 5,
// a dropped label in the first; the weights are constants to autograd.
TEST(DFlashDraftTest, DPaceWeighsEachRowByItsShareInTheExpectedAcceptedLength) {
  torch::manual_seed(3);
  const int64_t B = 5;
  const double alpha = 0.3;
  const at::Tensor logits = torch::randn({2 * B, 7}, kDFlashF64).requires_grad_(true);
  const at::Tensor labels = torch::tensor({-1, 2, -1, 4, 0, -1, 6, 1, 3, 5}, torch::kLong);
  const at::Tensor row_nll = DFlashRowNll(logits, labels);
  const at::Tensor loss = DFlashDPaceLoss(row_nll, labels, B, alpha);
  loss.backward();

  const at::Tensor nll = row_nll.detach();
  at::Tensor want_grad = torch::zeros_like(logits);
  double want = 0;
  for (int64_t blk = 0; blk < 2; ++blk) {
    std::vector<double> reach(B, 0.0);
    double prefix = 1.0;
    for (int64_t k = 1; k < B; ++k) {
      const int64_t r = blk * B + k;
      if (labels[r].item<int64_t>() < 0) continue;  // a no-op in the product, no term in the sums
      prefix *= (1 - alpha) * std::exp(-nll[r].item<double>()) + alpha;
      reach[k] = prefix;
    }
    for (int64_t k = 1; k < B; ++k) {
      const int64_t r = blk * B + k;
      if (labels[r].item<int64_t>() < 0) continue;
      double w = 0;
      for (int64_t i = k; i < B; ++i) w += reach[i];
      want += w * nll[r].item<double>() / 2.0;
      // d nll / d logits = softmax - onehot, times the constant weight.
      at::Tensor g = torch::softmax(logits.detach()[r], -1);
      g[labels[r].item<int64_t>()] -= 1.0;
      want_grad[r] = g * (w / 2.0);
    }
  }
  EXPECT_NEAR(loss.item<double>(), want, 1e-12);
  EXPECT_LT((logits.grad() - want_grad).abs().max().item<double>(), 1e-12);
}

// Distillation rows: the cross-entropy against softmax(head @ h), in
// chunks or at once, and its gradient softmax(logits) - p.
TEST(DFlashDraftTest, SoftCrossEntropyRowsAreTheTargetDistributionsOwn) {
  torch::manual_seed(4);
  const at::Tensor logits = torch::randn({7, 11}, kDFlashF64).requires_grad_(true);
  const at::Tensor hidden = torch::randn({7, 3}, kDFlashF64), head = torch::randn({11, 3}, kDFlashF64);
  const at::Tensor p = torch::softmax(torch::matmul(hidden, head.t()), -1);
  const at::Tensor want = -(p * torch::log_softmax(logits.detach(), -1)).sum(-1);
  const at::Tensor chunked = DFlashRowSoftCe(logits, hidden, head, /*chunk_rows=*/3);
  EXPECT_LT((chunked.detach() - want).abs().max().item<double>(), 1e-12);
  EXPECT_LT((DFlashRowSoftCe(logits, hidden, head).detach() - want).abs().max().item<double>(), 1e-12);
  chunked.sum().backward();
  EXPECT_LT((logits.grad() - (torch::softmax(logits.detach(), -1) - p)).abs().max().item<double>(), 1e-12);
  // A one-hot target distribution is the label's cross-entropy.
  const at::Tensor sharp_head = head * 1e4;
  const at::Tensor argmax = torch::matmul(hidden, sharp_head.t()).argmax(-1);
  EXPECT_LT((DFlashRowSoftCe(logits, hidden, sharp_head).detach() - DFlashRowNll(logits.detach(), argmax))
                .abs()
                .max()
                .item<double>(),
            1e-9);
}

DFlashFrozenTensors TinyTarget(const DFlashDraftConfig& c) {
  return {torch::randn({c.vocab_size, c.hidden_size}, kDFlashF64), torch::randn({c.vocab_size, c.hidden_size}, kDFlashF64)};
}

TEST(DFlashDraftTest, TheExportIsTheLoadersLayoutAndLoadsBack) {
  torch::manual_seed(12);
  DFlashDraftConfig c = TinyDFlashConfig();
  c.num_target_layers = 6;
  c.max_position_embeddings = 256;
  const DFlashFrozenTensors target = TinyTarget(c);
  auto trained = CreateDFlashDraft(c, kDFlashF64, 1, target), fresh = CreateDFlashDraft(c, kDFlashF64, 2, target);
  ASSERT_TRUE(trained.ok() && fresh.ok());
  const std::string dir = testing::ScratchDir("dflash_export");
  DraftExportOptions o;
  o.dtype = at::kFloat;
  ASSERT_TRUE((*trained)->Export(dir, o).ok());
  const nlohmann::json j = nlohmann::json::parse(*ReadFileToString(dir + "/config.json"));
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"DFlashDraftModel"}));
  EXPECT_EQ(j["model_type"], "qwen3");
  EXPECT_EQ(j["block_size"], 4);
  EXPECT_EQ(j["num_target_layers"], 6);
  EXPECT_EQ(j["dflash_config"]["mask_token_id"], 39);
  EXPECT_EQ(j["dflash_config"]["target_layer_ids"], nlohmann::json::array({1, 3}));
  EXPECT_EQ(j["layer_types"], nlohmann::json::array({"full_attention", "full_attention"}));
  auto file = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  for (const std::string& name : (*file)->Names()) {
    EXPECT_EQ(name.rfind("model.", 0), std::string::npos) << name;
    EXPECT_EQ(name.find("embed_tokens"), std::string::npos) << name;
    EXPECT_EQ(name.find("lm_head"), std::string::npos) << name;
  }
  EXPECT_EQ((*file)->Names().size(), (*trained)->ExportedParameters().size());
  ASSERT_TRUE((*fresh)->LoadExport(dir, OtherTarget::kRefuse).ok());
  EXPECT_TRUE(torch::allclose((*fresh)->flat().data(), (*trained)->flat().data().to(at::kFloat).to(at::kDouble)));
}

TEST(DFlashDraftTest, AnExportOfAnotherDraftIsRefusedBeforeAnyCopy) {
  DFlashDraftConfig c = TinyDFlashConfig();
  c.max_position_embeddings = 256;
  auto other = c;
  other.target_layer_ids = {1, 2};
  auto exported = CreateDFlashDraft(other, kDFlashF64, 1), mine = CreateDFlashDraft(c, kDFlashF64, 2);
  ASSERT_TRUE(exported.ok() && mine.ok());
  const std::string dir = testing::ScratchDir("dflash_other");
  ASSERT_TRUE((*exported)->Export(dir, DraftExportOptions{at::kFloat}).ok());
  const at::Tensor before = (*mine)->flat().data().clone();
  const absl::Status s = (*mine)->LoadExport(dir, OtherTarget::kRefuse);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("\"dflash_config.target_layer_ids\" is [1, 2], but the draft reads [1, 3]"),
            std::string::npos) << s;
  EXPECT_TRUE(torch::equal(before, (*mine)->flat().data()));
}

TEST(DFlashDraftTest, EachRowsRoundProposesItsBlockFromTheNextToken) {
  torch::manual_seed(13);
  const DFlashDraftConfig c = TinyDFlashConfig();
  auto d = CreateDFlashDraft(c, kDFlashF64, 3, TinyTarget(c));
  ASSERT_TRUE(d.ok());
  EvalBatch batch;
  batch.cu_seqlens = {0, 5, 12};
  batch.prompt_lengths = {2, 3};
  batch.input_ids = torch::randint(0, 39, {12}, torch::kLong);
  batch.aux_hidden = torch::randn({12, 2 * c.hidden_size}, kDFlashF64);
  auto chains = (*d)->ProposeChains(batch, c.block_size + 1);
  ASSERT_TRUE(chains.ok()) << chains.status();
  ASSERT_EQ(chains->sizes(), (std::vector<int64_t>{12, c.block_size + 1}));
  const at::Tensor context = (*d)->ProjectContext(batch.aux_hidden);
  torch::NoGradGuard no_grad;
  for (int64_t t = 0; t < 12; ++t) {
    const int64_t start = t < 5 ? 0 : 5, end = t < 5 ? 5 : 12;
    if (t + 1 >= end) {  // a sample's last row has no next token
      EXPECT_EQ((*chains)[t].max().item<int64_t>(), -1) << t;
      continue;
    }
    std::vector<int64_t> tokens = {batch.input_ids[t + 1].item<int64_t>()};
    for (int64_t k = 1; k < c.block_size; ++k) tokens.push_back(c.mask_token_id);
    const at::Tensor embeds = (*d)->embed_tokens.index_select(0, torch::tensor(tokens, torch::kLong));
    const at::Tensor hidden = PlainDFlashBlock(**d, context.narrow(0, start, t + 1 - start), embeds);
    const at::Tensor want = (*d)->Logits(hidden).argmax(-1).narrow(0, 1, c.block_size - 1);
    EXPECT_TRUE(torch::equal((*chains)[t].narrow(0, 0, c.block_size - 1), want)) << t;
    EXPECT_EQ((*chains)[t][c.block_size - 1].item<int64_t>(), -1) << "past the block";
  }
}

}  // namespace
}  // namespace e3
