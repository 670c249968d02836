#include "server/job_state.h"

namespace moebatch {

std::string_view JobStateName(JobState state) {
  switch (state) {
    case JobState::kValidating:
      return "validating";
    case JobState::kInProgress:
      return "in_progress";
    case JobState::kFinalizing:
      return "finalizing";
    case JobState::kCompleted:
      return "completed";
    case JobState::kFailed:
      return "failed";
    case JobState::kCancelling:
      return "cancelling";
    case JobState::kCancelled:
      return "cancelled";
    case JobState::kExpired:
      return "expired";
  }
  return "unknown";  // a number outside the enum (e.g. read from a newer database)
}

}  // namespace moebatch
