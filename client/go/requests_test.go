package moebatch

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "moebatch/client/go/moebatchv1"
)

func TestSamplingProtoCarriesEveryField(t *testing.T) {
	temperature, topP := float32(0.5), float32(0.9)
	topK, maxTokens, n, topLogprobs := int32(4), int32(32), int32(3), int32(5)
	seed, logprobs, format := uint64(7), true, "json_object"
	s := Sampling{Temperature: &temperature, TopP: &topP, TopK: &topK, Seed: &seed,
		MaxTokens: &maxTokens, Stop: []string{"\n"}, IgnoreEOS: true, N: &n, Logprobs: &logprobs,
		TopLogprobs: &topLogprobs, ResponseFormat: &format}
	want := &pb.SamplingParams{Temperature: &temperature, TopP: &topP, TopK: &topK, Seed: &seed,
		MaxTokens: &maxTokens, Stop: []string{"\n"}, IgnoreEos: true, N: &n, Logprobs: &logprobs,
		TopLogprobs: &topLogprobs, ResponseFormat: &format}
	if got := s.Proto(); !proto.Equal(got, want) {
		t.Errorf("Proto() = %v, want %v", got, want)
	}
	// Unset fields stay unset: the daemon's defaults apply.
	if got := (Sampling{}).Proto(); got.N != nil || got.Logprobs != nil || got.TopLogprobs != nil ||
		got.ResponseFormat != nil {
		t.Errorf("empty Sampling set fields: %v", got)
	}
}
