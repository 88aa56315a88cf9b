// A damaged trainer_state.json in a checkpoint: refused naming the file,
// or a state whose step and cursors are non-negative and which writes
// back to the same state.
#include <cstdint>

#include "student_trainer/state/trainer_state.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto st = e3::ParseTrainerState(e3::fuzz::AsString(data, size), "ckpt/trainer_state.json");
  if (!st.ok()) {
    E3_FUZZ_CHECK(st.status().message().rfind("ckpt/trainer_state.json: ", 0) == 0);
    E3_FUZZ_CHECK(st.status().message().size() < 512);
    return 0;
  }
  E3_FUZZ_CHECK(st->step >= 0 && st->tokens >= 0);
  for (const auto& c : st->cursors) E3_FUZZ_CHECK(c.epoch >= 0 && c.next_batch >= 0);
  auto again = e3::ParseTrainerState(e3::TrainerStateToJson(*st), "again");
  E3_FUZZ_CHECK(again.ok());
  E3_FUZZ_CHECK(again->step == st->step && again->tokens == st->tokens &&
                again->subscriber_id == st->subscriber_id);
  E3_FUZZ_CHECK(again->cursors.size() == st->cursors.size());
  return 0;
}
