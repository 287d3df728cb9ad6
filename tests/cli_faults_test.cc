// Issue 11, "Bad input and faults": what a hostile probe of the CLI found, each case run as
// a user runs it. A failed command exits non-zero with a message in kiln's words, before
// any work where it can tell, and leaves what was on disk as it was.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "frontends/hf_checkpoint.h"
#include "frontends/model_config.h"
#include "frontends/training_checkpoint.h"
#include "frontends/weight_init.h"
#include "ir/file_util.h"
#include "runtime/memory_estimate.h"
#include "tests/testing/run_command.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;
using ::kiln::testing::Kiln;
using ::kiln::testing::RunCommand;

const std::string kTinyTrain = " --backend cpu --batch 2 --seq 16";

class CliFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("kiln_faults_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string Read(const std::string& name) const { return *ReadFileToString(Path(name)); }
  void Write(const std::string& name, const std::string& contents) const {
    ASSERT_TRUE(WriteFileAtomically(Path(name), contents).ok());
  }
  // The loss printed for `step`, or "" (the text after "loss " up to the next space).
  static std::string LossAt(const std::string& output, int step) {
    for (absl::string_view line : absl::StrSplit(output, '\n')) {
      const std::string prefix = absl::StrCat("step ", step, "/");
      if (!absl::StartsWith(line, prefix)) continue;
      size_t at = line.find("loss ");
      return std::string(line.substr(at + 5, line.find(' ', at + 5) - at - 5));
    }
    return "";
  }
  fs::path dir_;
};

// 1. Writes follow symlinks, write devices in place, and never report bytes not written.
TEST_F(CliFaultsTest, WritesFollowSymlinksAndNeverReportUnwrittenBytes) {
  Write("real.kir", "old");
  fs::create_symlink("real.kir", dir_ / "link.kir");
  auto dump = RunCommand(Kiln() + " dump llama-tiny -o " + Path("link.kir"));
  ASSERT_EQ(dump.exit_code, 0) << dump.output;
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.kir"));
  EXPECT_TRUE(absl::StartsWith(Read("real.kir"), "module @llama-tiny")) << Read("real.kir").substr(0, 100);

  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full here";
  // Braces: RunCommand's 2>&1 then applies to the group, so stderr still reaches the test.
  auto models = RunCommand("{ " + Kiln() + " models > /dev/full; }");
  EXPECT_NE(models.exit_code, 0) << models.output;
  EXPECT_TRUE(absl::StrContains(models.output, "kiln models: cannot write to standard output")) << models.output;

  auto save = RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 1 --save /dev/full");
  EXPECT_EQ(save.exit_code, 1) << save.output;
  EXPECT_TRUE(absl::StrContains(save.output, "/dev/full")) << save.output;
  EXPECT_FALSE(absl::StrContains(save.output, "saved step")) << save.output;
  struct stat st;
  ASSERT_EQ(::stat("/dev/full", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
}

// 2. Training from a Hugging Face folder starts from its weights; a truncated file is an error.
TEST_F(CliFaultsTest, TrainFromAHuggingFaceFolderStartsFromItsWeights) {
  // The folder's weights are llama-tiny's initial weights of seed 7; the run's seed is 1337.
  ASSERT_TRUE(ExportHuggingFaceModel(Path("hf"), *PresetConfig("llama-tiny"),
                                     InitLlamaWeights(*PresetConfig("llama-tiny"), 7))
                  .ok());
  auto from_folder = RunCommand(Kiln() + " train " + Path("hf") + kTinyTrain + " --steps 1");
  ASSERT_EQ(from_folder.exit_code, 0) << from_folder.output;
  EXPECT_TRUE(absl::StartsWith(from_folder.output, "kiln train: ")) << from_folder.output;
  const std::string first_line = from_folder.output.substr(0, from_folder.output.find('\n'));
  EXPECT_TRUE(absl::StrContains(first_line, absl::StrCat("weights: ", Path("hf"), "/model.safetensors"))) << first_line;
  auto random = RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 1");
  ASSERT_EQ(random.exit_code, 0) << random.output;
  EXPECT_TRUE(absl::StrContains(random.output, "weights: random init (seed 1337)")) << random.output;
  EXPECT_NE(LossAt(from_folder.output, 1), LossAt(random.output, 1)) << from_folder.output << random.output;

  const std::string weights = Read("hf/model.safetensors");
  Write("hf/model.safetensors", weights.substr(0, weights.size() / 2));
  auto truncated = RunCommand(Kiln() + " train " + Path("hf") + kTinyTrain + " --steps 1");
  EXPECT_EQ(truncated.exit_code, 1) << truncated.output;
  EXPECT_TRUE(absl::StrContains(truncated.output, "model.safetensors")) << truncated.output;
  EXPECT_FALSE(absl::StrContains(truncated.output, "step 1/1")) << truncated.output;
}

// 3. Sizes that aborted the process are refused up front with the figure and the limit.
TEST_F(CliFaultsTest, SizesThatCannotFitAreRefusedBeforeAllocating) {
  auto expect_refused = [](const std::string& command, const std::string& expect) {
    auto r = RunCommand(command);
    EXPECT_EQ(r.signal, 0) << command << "\n" << r.output;
    EXPECT_EQ(r.exit_code, 1) << command << "\n" << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, expect)) << command << "\n" << r.output;
    EXPECT_FALSE(absl::StrContains(r.output, "step 1/")) << command << "\n" << r.output;
  };
  expect_refused(Kiln() + " train llama-tiny --backend cpu --steps 1 --batch 100000000", "2^40");
  expect_refused(Kiln() + " train llama-tiny --backend cpu --steps 1 --batch 1000000", "of host memory");
  expect_refused(Kiln() + " export-inputs llama-tiny --steps 1000000000 --out " + Path("out"), "of host memory");
  EXPECT_FALSE(fs::exists(Path("out")));

  // An HF config whose vocabulary is huge but within the per-tensor limit.
  fs::create_directories(dir_ / "huge");
  fs::create_directories(dir_ / "huger");
  Write("huge/config.json",
        R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 2,
            "num_attention_heads": 32, "vocab_size": 200000000, "max_position_embeddings": 64})");
  expect_refused(Kiln() + " train " + Path("huge") + " --backend cpu --steps 1", "of host memory");
  Write("huger/config.json",
        R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 2,
            "num_attention_heads": 32, "vocab_size": 2000000000})");
  expect_refused(Kiln() + " train " + Path("huger") + " --backend cpu --steps 1", "2^40");

  Write("big.kir",
        "module @big\n\nfunc @main {\n  %x = parameter() {index=0} : f32[1048576,1048576]\n"
        "  %y = neg(%x) : f32[1048576,1048576]\n  return %y\n}\n");
  expect_refused(Kiln() + " check " + Path("big.kir"), "of host memory");

  // llama-M on the CPU: about 40 GiB; refused wherever that is more than there is.
  absl::StatusOr<HostMemory> memory = AvailableHostMemory();
  if (memory.ok() && memory->available_bytes < (int64_t{32} << 30)) {
    expect_refused(Kiln() + " train llama-M --backend cpu --steps 1", "of host memory");
  }
}

// 4. Outputs are checked before the first step.
TEST_F(CliFaultsTest, OutputsAreCheckedBeforeAnyWork) {
  auto save = RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 2 --save " + Path("no/such/ck.st"));
  EXPECT_EQ(save.exit_code, 1) << save.output;
  EXPECT_TRUE(absl::StrContains(save.output, "--save")) << save.output;
  EXPECT_TRUE(absl::StrContains(save.output, "does not exist")) << save.output;
  EXPECT_FALSE(absl::StrContains(save.output, "step 1/")) << save.output;
  auto dump = RunCommand(Kiln() + " dump llama-tiny -o " + Path("no/x.kir"));
  EXPECT_EQ(dump.exit_code, 1) << dump.output;
  EXPECT_TRUE(absl::StrContains(dump.output, "-o ")) << dump.output;
  fs::create_directories(dir_ / "folder");
  auto into_folder = RunCommand(Kiln() + " compile llama-tiny -o " + Path("folder"));
  EXPECT_EQ(into_folder.exit_code, 1) << into_folder.output;
  EXPECT_TRUE(absl::StrContains(into_folder.output, "is a directory")) << into_folder.output;
  EXPECT_FALSE(absl::StrContains(into_folder.output, "compiled")) << into_folder.output;
  EXPECT_TRUE(fs::is_directory(dir_ / "folder"));
}

// 5. A later save removes what a killed one left, never another live process's.
TEST_F(CliFaultsTest, SavesRemoveTempFilesOfKilledSaves) {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  const std::string stale = absl::StrCat("ck.st.tmp.", child);
  const std::string live = absl::StrCat("ck.st.tmp.", ::getpid());
  Write(stale, "partial");
  Write(live, "partial");
  auto r = RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 1 --save " + Path("ck.st"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(Path(stale)));
  EXPECT_TRUE(fs::exists(Path(live)));
  EXPECT_TRUE(fs::exists(Path("ck.st")));
}

// 6. The checkpoint records the data; a resume says every setting that differs.
TEST_F(CliFaultsTest, ResumeKeepsTheDataAndSaysWhatChanges) {
  const std::string data = std::string(KILN_SOURCE_DIR) + "/README.md";
  auto first = RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 2 --data " + data + " --save " +
                          Path("c.st"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto resumed = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 4 --resume " + Path("c.st"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(absl::StrContains(resumed.output, "data: " + fs::path(data).lexically_normal().string())) << resumed.output;
  EXPECT_FALSE(absl::StrContains(resumed.output, "built-in corpus")) << resumed.output;
  EXPECT_TRUE(absl::StrContains(resumed.output, "--steps 4 (the saved run had 2)")) << resumed.output;
  EXPECT_TRUE(absl::StrContains(resumed.output, "runs past the saved schedule's horizon (--lr-decay-steps 2)"))
      << resumed.output;
  // The schedule line says each value and where it came from: the first run's defaults
  // (warmup min(10, 2/10 + 1) = 1), then the checkpoint's saved values and a flag.
  EXPECT_TRUE(absl::StrContains(first.output, "kiln train: schedule: peak lr 0.003 (the default --lr) after 1 warmup "
                                              "step (the default --warmup), cosine to 0.0003 at step 2\n"))
      << first.output;
  EXPECT_TRUE(absl::StrContains(resumed.output, "kiln train: schedule: peak lr 0.003 (" + Path("c.st") +
                                                    "'s saved 'lr') after 1 warmup step"))
      << resumed.output;
  auto horizon = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 4 --lr-decay-steps 4 --resume " +
                            Path("c.st"));
  ASSERT_EQ(horizon.exit_code, 0) << horizon.output;
  EXPECT_TRUE(absl::StrContains(horizon.output, "resume changes the run: --lr-decay-steps 4 (the saved run had 2)"))
      << horizon.output;
  EXPECT_TRUE(absl::StrContains(horizon.output, "cosine to 0.0003 at step 4\n")) << horizon.output;
  auto other_batch = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 4 --batch 3 --resume " + Path("c.st"));
  EXPECT_EQ(other_batch.exit_code, 1) << other_batch.output;
  EXPECT_TRUE(absl::StrContains(other_batch.output, "--batch 3 differs")) << other_batch.output;

  // The saved data file is gone: an error, not the built-in corpus.
  fs::copy_file(data, Path("notes.txt"));
  ASSERT_EQ(RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 2 --data " + Path("notes.txt") +
                       " --save " + Path("d.st"))
                .exit_code,
            0);
  fs::remove(Path("notes.txt"));
  auto gone = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 4 --resume " + Path("d.st"));
  EXPECT_EQ(gone.exit_code, 1) << gone.output;
  EXPECT_TRUE(absl::StrContains(gone.output, "notes.txt")) << gone.output;
  EXPECT_TRUE(absl::StrContains(gone.output, "pass --data")) << gone.output;
}

// 7. Numbers are checked: non-finite checkpoints, NaN losses, out-of-range flags.
TEST_F(CliFaultsTest, NumbersAreNotTakenAtFaceValue) {
  ASSERT_EQ(RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 1 --save " + Path("ok.st")).exit_code, 0);
  absl::StatusOr<TrainingCheckpoint> ckpt = LoadTrainingCheckpoint(Path("ok.st"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  TrainingCheckpoint poisoned = *ckpt;
  poisoned.state.v[3].mutable_values()[5] = std::nan("");
  ASSERT_TRUE(SaveTrainingCheckpoint(Path("nan.st"), poisoned).ok());
  auto nan_resume = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 2 --resume " + Path("nan.st"));
  EXPECT_EQ(nan_resume.exit_code, 1) << nan_resume.output;
  EXPECT_TRUE(absl::StrContains(nan_resume.output, Path("nan.st") + ": tensor 'adamw.v.")) << nan_resume.output;
  EXPECT_TRUE(absl::StrContains(nan_resume.output, "nan at element 5")) << nan_resume.output;
  EXPECT_FALSE(absl::StrContains(nan_resume.output, "--lr")) << nan_resume.output;

  // A saved setting that is not a number: the error names the checkpoint, not a flag.
  TrainingCheckpoint bad_setting = *ckpt;
  bad_setting.settings["lr"] = "fast";
  ASSERT_TRUE(SaveTrainingCheckpoint(Path("bad.st"), bad_setting).ok());
  auto bad = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 2 --resume " + Path("bad.st"));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(absl::StrContains(bad.output, Path("bad.st") + "'s saved 'lr' is 'fast'")) << bad.output;
  EXPECT_FALSE(absl::StrContains(bad.output, "--lr expects")) << bad.output;

  // Weights that give a NaN loss: eval prints it and fails.
  std::vector<HostTensor> weights = InitLlamaWeights(*PresetConfig("llama-tiny"), 1);
  weights[1].mutable_values()[0] = std::nan("");  // the first norm's weight: every token meets it
  ASSERT_TRUE(ExportHuggingFaceModel(Path("nan-hf"), *PresetConfig("llama-tiny"), weights).ok());
  Write("data.txt", std::string(200, 'a'));
  auto eval = RunCommand(Kiln() + " eval " + Path("nan-hf") + " --backend cpu --seq 16 --batch 2 --data " +
                         Path("data.txt"));
  EXPECT_EQ(eval.exit_code, 1) << eval.output;
  EXPECT_TRUE(absl::StrContains(eval.output, "loss nan")) << eval.output;

  // The exported folder declares max_position_embeddings 64 (llama-tiny's context).
  auto long_seq = RunCommand(Kiln() + " eval " + Path("nan-hf") + " --backend cpu --seq 128 --data " + Path("data.txt"));
  EXPECT_EQ(long_seq.exit_code, 1) << long_seq.output;
  EXPECT_TRUE(absl::StrContains(long_seq.output, "max_position_embeddings of 64")) << long_seq.output;

  struct Case {
    std::string flags, expect;
  };
  for (const Case& c : std::vector<Case>{
           {" train llama-tiny --backend cpu --steps 2 --lr-decay-steps 0", "--lr-decay-steps expects an integer >= 1"},
           {" train llama-tiny --backend cpu --steps 2 --lr 0.01 --min-lr 0.1", "is above the peak"},
           {" check llama-tiny --batch 1 --seq 8 --rel-tolerance -1", "--rel-tolerance expects a finite non-negative"},
           {" check llama-tiny --batch 1 --seq 8 --abs-tolerance nan", "--abs-tolerance expects a finite non-negative"},
       }) {
    auto r = RunCommand(Kiln() + c.flags);
    EXPECT_EQ(r.exit_code, 1) << c.flags << "\n" << r.output;
    EXPECT_TRUE(absl::StrContains(r.output, c.expect)) << c.flags << "\n" << r.output;
    EXPECT_FALSE(absl::StrContains(r.output, "meaning preserved")) << c.flags << "\n" << r.output;
  }

  Write("attr.kir", "module @m\n\nfunc @main {\n  %x = parameter() {index=0} : f32[2]\n"
                    "  %y = neg(%x) {bogus=1} : f32[2]\n  return %y\n}\n");
  auto attr = RunCommand(Kiln() + " verify " + Path("attr.kir"));
  EXPECT_EQ(attr.exit_code, 1) << attr.output;
  EXPECT_TRUE(absl::StrContains(attr.output, "unknown attribute 'bogus' (neg takes no attributes;")) << attr.output;
}

// 8. Messages say what and where, in kiln's words, at a readable length.
TEST_F(CliFaultsTest, MessagesAreClearAndShort) {
  ASSERT_EQ(RunCommand(Kiln() + " dump llama-tiny --format proto -o " + Path("t.pb")).exit_code, 0);
  const std::string pb = Read("t.pb");
  Write("cut.pb", pb.substr(0, pb.size() / 2));
  auto proto = RunCommand(Kiln() + " verify " + Path("cut.pb"));
  EXPECT_EQ(proto.exit_code, 1) << proto.output;
  EXPECT_TRUE(absl::StrContains(proto.output, "at byte ")) << proto.output;
  EXPECT_TRUE(absl::StrContains(proto.output, "ModuleProto.functions[0]")) << proto.output;
  EXPECT_FALSE(absl::StrContains(proto.output, "[libprotobuf")) << proto.output;

  std::string operands, types;
  for (int i = 0; i < 100000; ++i) absl::StrAppend(&operands, i ? ", " : "", "%x");
  Write("wide.kir", absl::StrCat("module @m\n\nfunc @main {\n  %x = parameter() {index=0} : f32[2]\n",
                                 "  %y = concatenate(", operands, ") {dim=0} : f32[7]\n  return %y\n}\n"));
  auto wide = RunCommand(Kiln() + " verify " + Path("wide.kir"));
  EXPECT_EQ(wide.exit_code, 1) << wide.output.substr(0, 500);
  EXPECT_LT(wide.output.size(), 4000u) << wide.output.substr(0, 500);

  auto regex = RunCommand(Kiln() + " compile llama-tiny --dump-after '('");
  EXPECT_EQ(regex.exit_code, 1) << regex.output;
  EXPECT_TRUE(absl::StrContains(regex.output, "--dump-after: dump regex '(' is not a valid regular expression: a '(' "
                                              "is not closed"))
      << regex.output;

  ASSERT_EQ(RunCommand(Kiln() + " dump llama-tiny -o " + Path("t.kir")).exit_code, 0);
  auto ir_as_model = RunCommand(Kiln() + " train " + Path("t.kir") + " --backend cpu --steps 1");
  EXPECT_EQ(ir_as_model.exit_code, 1) << ir_as_model.output;
  EXPECT_TRUE(absl::StrContains(ir_as_model.output, "t.kir is a kiln IR module (text), but a model is expected"))
      << ir_as_model.output;
  EXPECT_FALSE(absl::StrContains(ir_as_model.output, "malformed JSON")) << ir_as_model.output;

  auto empty_data = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 1 --data ''");
  EXPECT_EQ(empty_data.exit_code, 1) << empty_data.output;
  EXPECT_TRUE(absl::StrContains(empty_data.output, "--data: the file name is empty")) << empty_data.output;
}

// Also: periodic checkpoints, keeping the last K, and a held-out loss.
TEST_F(CliFaultsTest, PeriodicCheckpointsAndHeldOutEvaluation) {
  auto r = RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 4 --save-every 1 --keep-last 2 " +
                      "--eval-every 2 --save " + Path("ck.st"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(Path("ck-step1.st")));
  EXPECT_TRUE(fs::exists(Path("ck-step2.st")));
  EXPECT_TRUE(fs::exists(Path("ck-step3.st")));
  EXPECT_TRUE(fs::exists(Path("ck.st")));
  EXPECT_TRUE(absl::StrContains(r.output, "eval step 2  held-out loss ")) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "eval step 4  held-out loss ")) << r.output;
  absl::StatusOr<TrainingCheckpoint> step3 = LoadTrainingCheckpoint(Path("ck-step3.st"));
  ASSERT_TRUE(step3.ok()) << step3.status();
  EXPECT_EQ(step3->state.step, 3);
  // The resumed run keeps training on the same split, without --eval-every too.
  auto resumed = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 4 --resume " + Path("ck-step3.st"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(absl::StrContains(resumed.output, "step 4/4")) << resumed.output;
  EXPECT_TRUE(absl::StrContains(resumed.output, "data: built-in corpus (runtime/data/default_corpus.txt) [0, "))
      << resumed.output;
  ASSERT_EQ(RunCommand(Kiln() + " train llama-tiny" + kTinyTrain + " --steps 1 --save " + Path("all.st")).exit_code, 0);
  auto now_held_out =
      RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 2 --eval-every 1 --resume " + Path("all.st"));
  ASSERT_EQ(now_held_out.exit_code, 0) << now_held_out.output;
  EXPECT_TRUE(absl::StrContains(now_held_out.output, "resume changes the run: --eval-every holds out the last tenth"))
      << now_held_out.output;
  auto without_save = RunCommand(Kiln() + " train llama-tiny --backend cpu --steps 2 --save-every 1");
  EXPECT_EQ(without_save.exit_code, 1) << without_save.output;
  EXPECT_TRUE(absl::StrContains(without_save.output, "--save-every needs --save")) << without_save.output;
}

}  // namespace
}  // namespace kiln
