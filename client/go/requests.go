package moebatch

import (
	pb "moebatch/client/go/moebatchv1"
)

// Sampling holds the sampling parameters of a request; nil pointers take the daemon's defaults
// (temperature 1, top_p 1, top_k off, a random seed, max_tokens from its configuration).
// Nothing is checked here: the daemon validates every field (docs/api.md, "Input line") and
// refuses a job with bad requests, listing each of them.
type Sampling struct {
	Temperature *float32
	TopP        *float32
	TopK        *int32
	Seed        *uint64
	MaxTokens   *int32
	Stop        []string
	IgnoreEOS   bool
	N           *int32 // choices per request, [1, 16]
	Logprobs    *bool  // report each generated token's log-probability
	TopLogprobs *int32 // most likely tokens per position ([0, 20] chat, [0, 5] completions)
	// ResponseFormat of a chat request: "text" (nil: the default) or "json_object" (JSON mode:
	// the reply is constrained to a JSON object).
	ResponseFormat *string
}

// Greedy is argmax sampling (temperature 0) of at most maxTokens tokens.
func Greedy(maxTokens int32) Sampling {
	t := float32(0)
	return Sampling{Temperature: &t, MaxTokens: &maxTokens}
}

// Proto is the SamplingParams message.
func (s Sampling) Proto() *pb.SamplingParams {
	return &pb.SamplingParams{
		Temperature:    s.Temperature,
		TopP:           s.TopP,
		TopK:           s.TopK,
		Seed:           s.Seed,
		MaxTokens:      s.MaxTokens,
		Stop:           append([]string(nil), s.Stop...),
		IgnoreEos:      s.IgnoreEOS,
		N:              s.N,
		Logprobs:       s.Logprobs,
		TopLogprobs:    s.TopLogprobs,
		ResponseFormat: s.ResponseFormat,
	}
}

// ChatRequest is a /v1/chat/completions request of one user message.
func ChatRequest(customID, userText string, s Sampling) *pb.BatchRequest {
	return ChatMessagesRequest(customID, []*pb.ChatMessage{{Role: "user", Content: userText}}, s)
}

// ChatMessagesRequest is a /v1/chat/completions request of a conversation: roles "system"
// (optional, first), then "user" and "assistant" alternating, ending with "user".
func ChatMessagesRequest(customID string, messages []*pb.ChatMessage, s Sampling) *pb.BatchRequest {
	return &pb.BatchRequest{
		CustomId: customID,
		Input:    &pb.BatchRequest_Chat{Chat: &pb.ChatMessages{Messages: messages}},
		Sampling: s.Proto(),
	}
}

// CompletionRequest is a /v1/completions request of a text prompt (the daemon adds BOS).
func CompletionRequest(customID, prompt string, s Sampling) *pb.BatchRequest {
	return &pb.BatchRequest{
		CustomId: customID,
		Input:    &pb.BatchRequest_Prompt{Prompt: prompt},
		Sampling: s.Proto(),
	}
}

// TokenIDsRequest is a /v1/completions request of a prompt given as token ids, used as they
// are (no BOS added).
func TokenIDsRequest(customID string, ids []int32, s Sampling) *pb.BatchRequest {
	return &pb.BatchRequest{
		CustomId: customID,
		Input:    &pb.BatchRequest_PromptTokenIds{PromptTokenIds: &pb.TokenIds{Ids: ids}},
		Sampling: s.Proto(),
	}
}
