// Job states, numbered as moebatch.v1.JobState in proto/moebatch/v1/batch.proto (the OpenAI Batch
// API's states), so the store and the gRPC layer share them without a proto dependency.
#pragma once

#include <string_view>

namespace moebatch {

enum class JobState : int {
  kValidating = 1,
  kInProgress = 2,
  kFinalizing = 3,
  kCompleted = 4,
  kFailed = 5,
  kCancelling = 6,
  kCancelled = 7,
  kExpired = 8,  // not finished within its completion window (expires_at)
};

// "validating", "in_progress", ... (the OpenAI spelling).
std::string_view JobStateName(JobState state);

inline bool IsTerminal(JobState s) {
  return s == JobState::kCompleted || s == JobState::kFailed || s == JobState::kCancelled ||
         s == JobState::kExpired;
}

}  // namespace moebatch
