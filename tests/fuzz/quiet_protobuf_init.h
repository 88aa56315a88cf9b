// The libFuzzer start-up hook of the harnesses that parse protobuf
// messages. Include it from exactly one file of a harness: it defines the
// harness's LLVMFuzzerInitialize.
//
// protobuf logs every string field of invalid UTF-8 it refuses; the
// refusal is what is tested, the log line only slows the run.
#ifndef E3_TESTS_FUZZ_QUIET_PROTOBUF_INIT_H_
#define E3_TESTS_FUZZ_QUIET_PROTOBUF_INIT_H_

#include <google/protobuf/stubs/logging.h>

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

#endif  // E3_TESTS_FUZZ_QUIET_PROTOBUF_INIT_H_
